"""Where each limit of a turn trips, and the reason it gives (RUNNER.md, "Limits")."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.policy import ExecutionPolicy
from app.domain.status import TurnEvent


@dataclass(frozen=True)
class Counters:
    iterations: int = 0
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class LimitTrip:
    event: TurnEvent
    reason: str


def _trip(event: TurnEvent, name: str, used: int, limit: int) -> LimitTrip:
    return LimitTrip(event, f"{name} (used={used}, limit={limit})")


def before_step(policy: ExecutionPolicy, c: Counters) -> LimitTrip | None:
    """max_steps, checked before every step."""
    if c.steps >= policy.max_steps:
        return _trip(TurnEvent.MAX_STEPS, "max_steps", c.steps, policy.max_steps)
    return None


def before_model_call(policy: ExecutionPolicy, c: Counters) -> LimitTrip | None:
    """max_iterations, checked before every model call."""
    if c.iterations >= policy.max_iterations:
        return _trip(
            TurnEvent.MAX_ITERATIONS, "max_iterations", c.iterations, policy.max_iterations
        )
    return None


def before_tool_call(policy: ExecutionPolicy, c: Counters) -> LimitTrip | None:
    """max_tool_calls, checked before each real tool execution (used >= limit trips)."""
    limit = policy.budget.max_tool_calls
    if limit and c.tool_calls >= limit:
        return _trip(TurnEvent.BUDGET, "max_tool_calls", c.tool_calls, limit)
    return None


def before_external_tool_calls(policy: ExecutionPolicy, c: Counters, n: int) -> LimitTrip | None:
    """max_tool_calls before handing `n` calls to the client (they count once answered)."""
    limit = policy.budget.max_tool_calls
    if limit and c.tool_calls + n > limit:
        return LimitTrip(
            TurnEvent.BUDGET,
            f"max_tool_calls (used={c.tool_calls}, requested={n}, limit={limit})",
        )
    return None


def after_model_answer(policy: ExecutionPolicy, c: Counters) -> LimitTrip | None:
    """Token limits, checked after each model answer from its usage (used > limit trips)."""
    b = policy.budget
    for name, used, limit in (
        ("max_input_tokens", c.input_tokens, b.max_input_tokens),
        ("max_output_tokens", c.output_tokens, b.max_output_tokens),
        ("max_total_tokens", c.total_tokens, b.max_total_tokens),
    ):
        if limit and used > limit:
            return _trip(TurnEvent.BUDGET, name, used, limit)
    return None


def remaining_duration_ms(policy: ExecutionPolicy, elapsed_ms: int) -> int | None:
    """Wall time left of max_duration_ms, or None when unlimited."""
    limit = policy.budget.max_duration_ms
    return None if not limit else limit - elapsed_ms


def duration_exceeded(policy: ExecutionPolicy, elapsed_ms: int) -> LimitTrip | None:
    """max_duration_ms since the turn was created, checked before every model and tool call."""
    limit = policy.budget.max_duration_ms
    if limit and elapsed_ms >= limit:
        return _trip(TurnEvent.BUDGET, "max_duration_ms", elapsed_ms, limit)
    return None
