"""Every Prometheus metric of the service, defined once.

Labels stay low-cardinality (never a turn id)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from app.domain.failures import DEFAULT_RETRYABLE, SOURCE_OF
from app.domain.status import TurnStatus

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

turns_created = Counter("turnrunner_turns_created", "Turns created.", ["agent"])
turns_finished = Counter(
    "turnrunner_turns_finished", "Turns that reached a terminal status.", ["agent", "status"]
)
errors = Counter(
    "turnrunner_errors", "Classified model, tool and runner failures.", ["source", "error_class"]
)
retries_scheduled = Counter(
    "turnrunner_retries_scheduled",
    "Retries scheduled (RETRY_SCHEDULED entered).",
    ["source", "error_class"],
)
model_calls = Counter("turnrunner_model_calls", "Model calls by outcome.", ["model", "outcome"])
model_call_duration = Histogram(
    "turnrunner_model_call_duration_seconds", "Model call latency.", ["model"], buckets=_LATENCY
)
tool_calls = Counter("turnrunner_tool_calls", "Tool executions by outcome.", ["tool", "outcome"])
tool_call_duration = Histogram(
    "turnrunner_tool_call_duration_seconds", "Tool execution latency.", ["tool"], buckets=_LATENCY
)
tokens = Counter(
    "turnrunner_tokens", "Tokens used, by direction (input|output).", ["model", "direction"]
)
turns = Gauge("turnrunner_turns", "Turns currently in each status (all processes).", ["status"])
retry_lag = Histogram(
    "turnrunner_retry_lag_seconds",
    "How late a retry resumed: resumed at minus next_runnable_at.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
commands = Counter(
    "turnrunner_commands", "Turn commands received, by outcome.", ["command", "outcome"]
)
http_requests = Counter(
    "turnrunner_http_requests", "HTTP requests served.", ["method", "route", "status"]
)
http_request_duration = Histogram(
    "turnrunner_http_request_duration_seconds",
    "HTTP request latency.",
    ["method", "route"],
    buckets=_LATENCY,
)
steps_committed = Counter("turnrunner_steps_committed", "Durable runner steps committed.")
step_batch_size = Histogram(
    "turnrunner_step_batch_size",
    "Steps carried by one group-commit transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
step_commit_duration = Histogram(
    "turnrunner_step_commit_duration_seconds",
    "Time to commit one group-commit transaction of steps.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)

# Label values known in advance, exported at 0 before their first event (Prometheus' advice on
# missing metrics): rate() and the dashboard then show 0, not "no data". Open-ended labels (agent,
# model, tool, route) are never initialised.
_COMMANDS = (
    "RETRY",
    "CONTINUE",
    "RETRY_MODEL",
    "USER_MESSAGE",
    "TOOL_RESULT",
    "TOOL_ERROR",
    "CANCEL",
)


def init_label_sets(*, api: bool = False, runner: bool = False) -> None:
    """Create the known label sets at 0: `api` for the series the API process moves (live turn
    statuses, commands), `runner` for the worker's (error and retry classes). Idempotent."""
    if api:
        for status in TurnStatus:
            if not status.is_terminal:  # the gauge counts live turns only
                turns.labels(status.value)
        for command in _COMMANDS:
            commands.labels(command, "accepted")
    if runner:
        for error_class, source in SOURCE_OF.items():
            errors.labels(source.value, error_class.value)
        for error_class in DEFAULT_RETRYABLE:
            retries_scheduled.labels(SOURCE_OF[error_class].value, error_class.value)
