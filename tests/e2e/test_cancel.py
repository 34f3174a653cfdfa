"""Cancel: a running turn is aborted mid-call and finalized within 1 s; a scheduled retry is
cancelled at once and never resumes."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tests.e2e.conftest import Api, FakeLLM


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _wait_model_requests(fake: FakeLLM, model: str, n: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while fake.requests(model) < n:
        assert time.monotonic() < deadline, f"the fake never saw {n} request(s) for {model}"
        time.sleep(0.02)


def test_cancel_during_hanging_model_call(stack: Api, fake: FakeLLM, model: str) -> None:
    fake.script(model, {"hang_ms": 30_000})
    stack.create_agent(model, fake.spec(model), system_prompt="be quick")
    turn = stack.create_turn(model, "take your time")
    stack.wait_status(turn["id"], "RUNNING")
    _wait_model_requests(fake, model, 1)  # the worker is inside the model call now

    r = stack.http.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "user pressed stop"})
    answered = time.monotonic()
    assert r.status_code == 202, r.text
    flagged = r.json()
    assert flagged["cancel_requested"] is True
    # Fine-grained long-poll: each change of the turn wakes us at once.
    turn_now = flagged
    while turn_now["status"] != "CANCELLED" and time.monotonic() - answered < 5.0:
        turn_now = stack.http.get(
            f"/v1/turns/{turn['id']}",
            params={"wait_ms": 1000, "after_version": turn_now["version"]},
        ).json()
    elapsed = time.monotonic() - answered
    assert turn_now["status"] == "CANCELLED", turn_now
    assert elapsed < 1.0, f"cancelled {elapsed:.3f} s after the cancel command answered"
    assert turn_now["status_reason"] == "user pressed stop"
    assert turn_now["finished_at"] is not None

    messages = stack.messages(turn["id"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[-1]["content"] == "This turn ended before completion: user pressed stop"
    events = stack.events(turn["id"])
    assert len(_of(events, "cancelled")) == 1
    assert [(d["from"], d["to"]) for d in _of(events, "status_changed")] == [
        ("READY", "RUNNING"),
        ("RUNNING", "CANCELLED"),
    ]
    assert [d["command"] for d in _of(events, "command")] == ["CANCEL"]
    assert fake.requests(model) == 1

    # Cancelling again answers the cancelled turn, and changes nothing.
    again = stack.command(turn["id"], "cancel", {"reason": "twice"})
    assert again["status"] == "CANCELLED" and again["version"] == turn_now["version"]
    assert len(stack.messages(turn["id"])) == 3


def test_cancel_during_retry_scheduled_never_resumes(stack: Api, fake: FakeLLM, model: str) -> None:
    fake.script(model, {"error": {"status": 503}}, {"content": "must never be reached"})
    policy = {"retry": {"max_retries": 3, "initial_delay_ms": 2000}}
    stack.create_agent(model, fake.spec(model), policy=policy)
    turn = stack.create_turn(model, "go")
    scheduled = stack.wait_status(turn["id"], "RETRY_SCHEDULED")
    due = _at(scheduled["next_runnable_at"])

    cancelled = stack.command(turn["id"], "cancel")
    # No worker holds a scheduled turn, so the cancel is final at once.
    assert cancelled["status"] == "CANCELLED", cancelled
    assert cancelled["status_reason"] == "cancelled by caller"
    assert cancelled["next_runnable_at"] is None
    assert datetime.now(UTC) < due, "the cancel must land before the retry is due"
    log_at_cancel = stack.events(turn["id"])
    assert [e["type"] for e in log_at_cancel][-3:] == ["cancelled", "status_changed", "command"]
    assert log_at_cancel[-2]["data"]["to"] == "CANCELLED"

    # Wait past the original due time (with room for a scheduler poll), then look again.
    while datetime.now(UTC) < due:
        time.sleep(0.05)
    time.sleep(0.5)
    after = stack.turn(turn["id"])
    assert after["status"] == "CANCELLED"
    assert after["version"] == cancelled["version"]
    assert fake.requests(model) == 1
    events = stack.events(turn["id"])
    assert events == log_at_cancel  # nothing happened to it since
    assert _of(events, "retry_resumed") == []
    messages = stack.messages(turn["id"])
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[-1]["content"] == "This turn ended before completion: cancelled by caller"
