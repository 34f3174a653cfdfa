"""The retry policy against real faults: exponential delays, exhaustion, repair, retry-model."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Api, FakeLLM

POLICY = {"retry": {"max_retries": 3, "initial_delay_ms": 100, "multiplier": 2.0}}


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def test_three_overloads_then_success(stack: Api, fake: FakeLLM, model: str) -> None:
    fake.faults(model, {"status": 503, "count": 3})
    fake.script(model, {"content": "made it"})
    stack.create_agent(model, fake.spec(model), policy=POLICY)
    turn = stack.create_turn(model, "go")
    done = stack.wait_terminal(turn["id"])
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "made it"
    assert (done["retry_count"], done["consecutive_retry_count"]) == (3, 0)
    assert done["last_error"] is None
    assert fake.requests(model) == 4

    events = stack.events(turn["id"])
    scheduled = _of(events, "retry_scheduled")
    assert [s["delay_ms"] for s in scheduled] == [100, 200, 400]
    assert [s["retry"] for s in scheduled] == [1, 2, 3]
    assert {s["error_class"] for s in scheduled} == {"overloaded"}
    assert not any(s["retry_after_honoured"] for s in scheduled)
    attempts = _of(events, "model_attempt")
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "error"),
        (2, "error"),
        (3, "error"),
        (4, "ok"),
    ]
    assert [r["by"] for r in _of(events, "retry_resumed")] == ["scheduler"] * 3


def test_endless_overload_waits_for_model_then_retry_model(
    stack: Api,
    fake: FakeLLM,
    model: str,
) -> None:
    fake.faults(model, {"status": 503, "count": 1_000_000})
    fake.script(model, {"content": "repaired"})
    stack.create_agent(model, fake.spec(model), policy=POLICY)
    turn = stack.create_turn(model, "go")
    waiting = stack.wait_status(turn["id"], "WAITING_FOR_MODEL")
    assert fake.requests(model) == 4  # the first attempt and three retries
    assert (waiting["retry_count"], waiting["consecutive_retry_count"]) == (3, 3)
    assert waiting["next_runnable_at"] is None
    err = waiting["last_error"]
    assert (err["error_class"], err["http_status"], err["retryable"]) == ("overloaded", 503, True)
    assert waiting["status_reason"].startswith("overloaded (retries exhausted)")
    events = stack.events(turn["id"])
    assert [s["delay_ms"] for s in _of(events, "retry_scheduled")] == [100, 200, 400]
    first_failure = _of(events, "model_attempt")[0]["failure_id"]
    assert first_failure != err["failure_id"]

    # Repair the model. An old failure id is refused; the turn stays where it is.
    fake.faults(model)
    r = stack.http.post(f"/v1/turns/{turn['id']}/retry-model", json={"failure_id": first_failure})
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "stale_failure"
    assert stack.turn(turn["id"])["status"] == "WAITING_FOR_MODEL"
    assert fake.requests(model) == 4  # no timer: nothing ran while it waited

    resumed = stack.command(turn["id"], "retry-model", {"failure_id": err["failure_id"]})
    assert resumed["status"] in {"RUNNING", "COMPLETED"}
    done = stack.wait_terminal(turn["id"])
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "repaired"
    assert (done["retry_count"], done["consecutive_retry_count"]) == (3, 0)
    assert fake.requests(model) == 5
    commands = [d["command"] for d in _of(stack.events(turn["id"]), "command")]
    assert commands == ["RETRY_MODEL"]

    # The same (now old) failure id again: the turn is finished.
    again = stack.http.post(
        f"/v1/turns/{turn['id']}/retry-model", json={"failure_id": err["failure_id"]}
    )
    assert again.status_code == 409 and again.json()["code"] == "turn_finished"
