"""The state machine (RUNNER.md, "State machine") and TurnUpdate.move, without I/O.

The expected table below is written out from RUNNER.md on purpose: it is not derived from
`app.domain.status.TRANSITIONS`, so a change to the code's table is caught here."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.status import (
    NON_TERMINAL,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    TurnEvent,
    TurnStatus,
    next_status,
)
from app.domain.update import TurnUpdate

S, E = TurnStatus, TurnEvent

TERMINAL_NAMES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "MAX_ITERATIONS_REACHED",
    "MAX_STEPS_REACHED",
    "BUDGET_EXCEEDED",
}
NON_TERMINAL_NAMES = {
    "READY",
    "RUNNING",
    "RETRY_SCHEDULED",
    "WAITING_FOR_MODEL",
    "WAITING_FOR_TOOL",
}

# RUNNER.md's table, one row per (from, event). (RUNNING, CLAIM) is the re-claim of a RUNNING turn
# whose lease expired (RUNNER.md, Durability: "Runnable = ... RUNNING with an expired lease").
EXPECTED: dict[tuple[TurnStatus, TurnEvent], TurnStatus] = {
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
    (S.READY, E.CANCEL): S.CANCELLED,
    (S.RUNNING, E.CANCEL): S.CANCELLED,
    (S.RETRY_SCHEDULED, E.CANCEL): S.CANCELLED,
    (S.WAITING_FOR_MODEL, E.CANCEL): S.CANCELLED,
    (S.WAITING_FOR_TOOL, E.CANCEL): S.CANCELLED,
}

ALL_PAIRS = list(itertools.product(TurnStatus, TurnEvent))
REFUSED = [pair for pair in ALL_PAIRS if pair not in EXPECTED]


def _id(pair: tuple[TurnStatus, TurnEvent]) -> str:
    return f"{pair[0].value}-{pair[1].value}"


# ---- statuses ---------------------------------------------------------------------------------


def test_status_values_are_the_exact_api_strings() -> None:
    assert {s.value for s in TurnStatus} == TERMINAL_NAMES | NON_TERMINAL_NAMES
    for s in TurnStatus:
        assert s.value == s.name
        assert str(s) == s.value


def test_terminal_and_non_terminal_sets() -> None:
    assert {s.value for s in TERMINAL} == TERMINAL_NAMES
    assert {s.value for s in NON_TERMINAL} == NON_TERMINAL_NAMES
    assert not (TERMINAL & NON_TERMINAL)


@pytest.mark.parametrize("status", list(TurnStatus), ids=lambda s: s.value)
def test_is_terminal(status: TurnStatus) -> None:
    assert status.is_terminal is (status.value in TERMINAL_NAMES)


# ---- the table --------------------------------------------------------------------------------


def test_code_table_is_exactly_the_documented_table() -> None:
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("pair", "to"), list(EXPECTED.items()), ids=[_id(p) for p in EXPECTED])
def test_allowed_move(pair: tuple[TurnStatus, TurnEvent], to: TurnStatus) -> None:
    current, event = pair
    assert next_status(current, event) is to


@pytest.mark.parametrize("pair", REFUSED, ids=[_id(p) for p in REFUSED])
def test_every_other_pair_is_refused(pair: tuple[TurnStatus, TurnEvent]) -> None:
    current, event = pair
    with pytest.raises(IllegalTransition) as info:
        next_status(current, event)
    assert info.value.current is current
    assert info.value.event is event
    assert str(info.value) == f"{event.value} is not allowed in {current.value}"


def test_refused_pairs_cover_the_rest_of_the_product() -> None:
    assert len(REFUSED) + len(EXPECTED) == len(TurnStatus) * len(TurnEvent)
    assert len(EXPECTED) == 23


@pytest.mark.parametrize(
    ("status", "event"),
    list(itertools.product(sorted(TERMINAL), TurnEvent)),
    ids=lambda v: v.value,
)
def test_terminal_statuses_allow_nothing(status: TurnStatus, event: TurnEvent) -> None:
    with pytest.raises(IllegalTransition):
        next_status(status, event)


@pytest.mark.parametrize("status", sorted(NON_TERMINAL), ids=lambda s: s.value)
def test_cancel_from_every_non_terminal(status: TurnStatus) -> None:
    assert next_status(status, TurnEvent.CANCEL) is TurnStatus.CANCELLED


@pytest.mark.parametrize("status", sorted(TERMINAL), ids=lambda s: s.value)
def test_cancel_from_terminal_is_refused(status: TurnStatus) -> None:
    with pytest.raises(IllegalTransition):
        next_status(status, TurnEvent.CANCEL)


@pytest.mark.parametrize("status", sorted(NON_TERMINAL - {S.RUNNING}), ids=lambda s: s.value)
def test_only_running_reaches_an_outcome_other_than_running_or_cancelled(
    status: TurnStatus,
) -> None:
    reachable = {to for (frm, _), to in EXPECTED.items() if frm is status}
    for event in TurnEvent:
        try:
            to = next_status(status, event)
        except IllegalTransition:
            continue
        assert to in reachable
        assert to in {S.RUNNING, S.CANCELLED}


def test_retry_model_only_from_waiting_for_model_and_retry_only_from_retry_scheduled() -> None:
    for status in TurnStatus:
        if status is not S.WAITING_FOR_MODEL:
            with pytest.raises(IllegalTransition):
                next_status(status, E.RETRY_MODEL)
        if status is not S.RETRY_SCHEDULED:
            with pytest.raises(IllegalTransition):
                next_status(status, E.RETRY)
            with pytest.raises(IllegalTransition):
                next_status(status, E.CONTINUE)


# ---- TurnUpdate.move --------------------------------------------------------------------------


def test_move_records_status_changed_event_and_values() -> None:
    upd = TurnUpdate(TurnStatus.READY)
    assert not (upd.values or upd.events or upd.messages)
    assert upd.move(TurnEvent.CLAIM, "claimed by w1") is TurnStatus.RUNNING
    assert upd.status is TurnStatus.RUNNING
    assert upd.values["status"] == "RUNNING"
    assert upd.values["status_reason"] == "claimed by w1"
    assert upd.events == [
        (
            "status_changed",
            {"from": "READY", "to": "RUNNING", "event": "claim", "reason": "claimed by w1"},
        )
    ]
    assert "finished_at" not in upd.values
    assert upd.release_lease is False
    assert upd.values and upd.events


def test_move_without_reason_clears_status_reason() -> None:
    upd = TurnUpdate(TurnStatus.RUNNING, values={"status_reason": "old"})
    upd.move(TurnEvent.SCHEDULE_RETRY)
    assert upd.values["status_reason"] is None
    assert upd.values["status"] == "RETRY_SCHEDULED"
    assert upd.events[-1][1]["reason"] is None


@pytest.mark.parametrize(
    ("event", "terminal"),
    [
        (E.COMPLETE, S.COMPLETED),
        (E.FAIL, S.FAILED),
        (E.CANCEL, S.CANCELLED),
        (E.MAX_ITERATIONS, S.MAX_ITERATIONS_REACHED),
        (E.MAX_STEPS, S.MAX_STEPS_REACHED),
        (E.BUDGET, S.BUDGET_EXCEEDED),
    ],
    ids=lambda v: v.value,
)
def test_terminal_move_sets_finished_at_and_releases_lease(
    event: TurnEvent, terminal: TurnStatus
) -> None:
    before = datetime.now(UTC)
    upd = TurnUpdate(TurnStatus.RUNNING)
    assert upd.move(event, "why") is terminal
    after = datetime.now(UTC)
    finished = upd.values["finished_at"]
    assert isinstance(finished, datetime)
    assert finished.utcoffset() == timedelta(0)
    assert before <= finished <= after
    assert upd.release_lease is True
    assert upd.events[-1] == (
        "status_changed",
        {"from": "RUNNING", "to": terminal.value, "event": event.value, "reason": "why"},
    )


@pytest.mark.parametrize(
    ("start", "event"),
    [
        (S.RUNNING, E.TOOL_CALLS),
        (S.RUNNING, E.WAIT_FOR_TOOL),
        (S.RUNNING, E.WAIT_FOR_MODEL),
        (S.RUNNING, E.SCHEDULE_RETRY),
        (S.RETRY_SCHEDULED, E.RETRY),
        (S.WAITING_FOR_TOOL, E.TOOL_RESULTS_IN),
    ],
    ids=lambda v: v.value,
)
def test_non_terminal_move_neither_finishes_nor_releases(
    start: TurnStatus, event: TurnEvent
) -> None:
    upd = TurnUpdate(start)
    upd.move(event)
    assert "finished_at" not in upd.values
    assert upd.release_lease is False


def test_illegal_move_raises_and_changes_nothing() -> None:
    upd = TurnUpdate(TurnStatus.COMPLETED)
    with pytest.raises(IllegalTransition):
        upd.move(TurnEvent.CANCEL, "late cancel")
    assert upd.status is TurnStatus.COMPLETED
    assert upd.values == {}
    assert upd.events == []
    assert upd.release_lease is False
    assert not (upd.values or upd.events or upd.messages)


def test_moves_chain_and_each_is_logged() -> None:
    upd = TurnUpdate(TurnStatus.READY)
    upd.move(E.CLAIM)
    upd.move(E.TOOL_CALLS)
    upd.move(E.WAIT_FOR_TOOL)
    upd.move(E.CANCEL, "cancelled by caller")
    assert upd.status is S.CANCELLED
    assert [(d["from"], d["to"]) for t, d in upd.events if t == "status_changed"] == [
        ("READY", "RUNNING"),
        ("RUNNING", "RUNNING"),
        ("RUNNING", "WAITING_FOR_TOOL"),
        ("WAITING_FOR_TOOL", "CANCELLED"),
    ]
    assert upd.release_lease is True


def test_update_event_and_message_helpers_append() -> None:
    from app.domain.transcript import Message

    upd = TurnUpdate(TurnStatus.RUNNING)
    upd.event("model_attempt", {"outcome": "ok"})
    upd.message(Message(role="assistant", content="hi"))
    assert upd.events == [("model_attempt", {"outcome": "ok"})]
    assert upd.messages == [Message(role="assistant", content="hi")]
    upd.add("steps")
    upd.add("steps", 2)
    assert upd.increments == {"steps": 3}


def test_fork_is_an_independent_copy() -> None:
    upd = TurnUpdate(TurnStatus.RUNNING)
    upd.event("model_attempt", {"outcome": "ok"})
    upd.add("steps")
    alt = upd.fork()
    upd.move(TurnEvent.COMPLETE)
    upd.add("steps")
    assert alt.status is TurnStatus.RUNNING
    assert alt.events == [("model_attempt", {"outcome": "ok"})]
    assert alt.increments == {"steps": 1}
    assert "status" not in alt.values
