"""Turn statuses and the one table of allowed moves between them (RUNNER.md, "State machine")."""

from __future__ import annotations

from enum import StrEnum


class TurnStatus(StrEnum):
    READY = "READY"
    RUNNING = "RUNNING"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    WAITING_FOR_MODEL = "WAITING_FOR_MODEL"
    WAITING_FOR_TOOL = "WAITING_FOR_TOOL"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MAX_ITERATIONS_REACHED = "MAX_ITERATIONS_REACHED"
    MAX_STEPS_REACHED = "MAX_STEPS_REACHED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {
        TurnStatus.COMPLETED,
        TurnStatus.FAILED,
        TurnStatus.CANCELLED,
        TurnStatus.MAX_ITERATIONS_REACHED,
        TurnStatus.MAX_STEPS_REACHED,
        TurnStatus.BUDGET_EXCEEDED,
    }
)
NON_TERMINAL = frozenset(s for s in TurnStatus if s not in TERMINAL)


class TurnEvent(StrEnum):
    """What makes a turn move; the names appear in the event log."""

    CLAIM = "claim"
    COMPLETE = "complete"
    TOOL_CALLS = "tool_calls"
    WAIT_FOR_TOOL = "wait_for_tool"
    SCHEDULE_RETRY = "schedule_retry"
    WAIT_FOR_MODEL = "wait_for_model"
    FAIL = "fail"
    MAX_ITERATIONS = "max_iterations"
    MAX_STEPS = "max_steps"
    BUDGET = "budget"
    RETRY = "retry"
    CONTINUE = "continue"
    USER_MESSAGE = "user_message"
    RETRY_MODEL = "retry_model"
    TOOL_RESULTS_IN = "tool_results_in"
    CANCEL = "cancel"


S, E = TurnStatus, TurnEvent

# (from, event) -> to. Anything not in this table is refused. A RUNNING turn whose lease expired
# is claimed again (RUNNING -> RUNNING); so is a RUNNING turn a command made runnable.
TRANSITIONS: dict[tuple[TurnStatus, TurnEvent], TurnStatus] = {
    (S.READY, E.CLAIM): S.RUNNING,
    (S.RUNNING, E.CLAIM): S.RUNNING,
    (S.RUNNING, E.COMPLETE): S.COMPLETED,
    (S.RUNNING, E.TOOL_CALLS): S.RUNNING,
    (S.RUNNING, E.WAIT_FOR_TOOL): S.WAITING_FOR_TOOL,
    (S.RUNNING, E.SCHEDULE_RETRY): S.RETRY_SCHEDULED,
    (S.RUNNING, E.WAIT_FOR_MODEL): S.WAITING_FOR_MODEL,
    (S.RUNNING, E.FAIL): S.FAILED,
    (S.RUNNING, E.MAX_ITERATIONS): S.MAX_ITERATIONS_REACHED,
    (S.RUNNING, E.MAX_STEPS): S.MAX_STEPS_REACHED,
    (S.RUNNING, E.BUDGET): S.BUDGET_EXCEEDED,
    (S.RETRY_SCHEDULED, E.RETRY): S.RUNNING,
    (S.RETRY_SCHEDULED, E.CONTINUE): S.RUNNING,
    (S.RETRY_SCHEDULED, E.USER_MESSAGE): S.RUNNING,
    (S.WAITING_FOR_MODEL, E.RETRY_MODEL): S.RUNNING,
    (S.WAITING_FOR_MODEL, E.USER_MESSAGE): S.RUNNING,
    (S.WAITING_FOR_TOOL, E.TOOL_RESULTS_IN): S.RUNNING,
    (S.WAITING_FOR_TOOL, E.USER_MESSAGE): S.RUNNING,
    **{(status, E.CANCEL): S.CANCELLED for status in NON_TERMINAL},
}


class IllegalTransition(Exception):
    """A move the state machine does not allow."""

    def __init__(self, current: TurnStatus, event: TurnEvent) -> None:
        super().__init__(f"{event.value} is not allowed in {current.value}")
        self.current = current
        self.event = event


def next_status(current: TurnStatus, event: TurnEvent) -> TurnStatus:
    """The status `event` moves a turn in `current` to, or IllegalTransition."""
    try:
        return TRANSITIONS[(current, event)]
    except KeyError:
        raise IllegalTransition(current, event) from None
