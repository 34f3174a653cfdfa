"""External tools: the turn waits in WAITING_FOR_TOOL until the client sends the results."""

from __future__ import annotations

import json
from typing import Any

from tests.e2e.conftest import Api, FakeLLM

LOOKUP = {
    "name": "lookup",
    "description": "the client looks it up",
    "kind": "external",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
TWO_CALLS = {
    "tool_calls": [
        {"name": "lookup", "arguments": {"q": "alpha"}},
        {"name": "lookup", "arguments": {"q": "beta"}},
    ]
}


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def _waiting(stack: Api, fake: FakeLLM, model: str, *replies: dict[str, Any]) -> dict[str, Any]:
    fake.script(model, *replies)
    # A client's tool error goes back to the model (under FAIL_RUN it would fail the turn).
    policy = {"tool_error_strategy": "RETURN_ERROR_TO_MODEL"}
    stack.create_agent(
        model, fake.spec(model), tools=[LOOKUP], system_prompt="use lookup", policy=policy
    )
    turn = stack.create_turn(model, "find alpha and beta")
    return stack.wait_status(turn["id"], "WAITING_FOR_TOOL")


def test_results_for_each_pending_call_run_the_turn_on(
    stack: Api, fake: FakeLLM, model: str
) -> None:
    waiting = _waiting(stack, fake, model, TWO_CALLS, {"content": "alpha is 1, beta failed"})
    turn_id = waiting["id"]
    pending = waiting["pending_tool_calls"]
    assert [(c["name"], c["arguments"]) for c in pending] == [
        ("lookup", {"q": "alpha"}),
        ("lookup", {"q": "beta"}),
    ]
    assert len({c["id"] for c in pending}) == 2
    assert waiting["status_reason"] == "waiting for 2 external tool call(s)"
    assert waiting["next_runnable_at"] is None
    assert fake.requests(model) == 1

    # An id that is not pending is refused.
    r = stack.http.post(
        f"/v1/turns/{turn_id}/tool-results", json={"tool_call_id": "call_nope", "content": "x"}
    )
    assert r.status_code == 409 and r.json()["code"] == "invalid_state", r.text

    first = stack.command(
        turn_id, "tool-results", {"tool_call_id": pending[0]["id"], "content": {"value": 1}}
    )
    assert first["status"] == "WAITING_FOR_TOOL"
    assert [c["id"] for c in first["pending_tool_calls"]] == [pending[1]["id"]]
    # The same result again: that call is no longer pending.
    again = stack.http.post(
        f"/v1/turns/{turn_id}/tool-results",
        json={"tool_call_id": pending[0]["id"], "content": "dup"},
    )
    assert again.status_code == 409 and again.json()["code"] == "invalid_state"

    last = stack.command(
        turn_id,
        "tool-results",
        {
            "tool_call_id": pending[1]["id"],
            "error": {"code": "NOT_FOUND", "message": "no such key: beta"},
        },
    )
    assert last["pending_tool_calls"] == []
    assert last["status"] in {"RUNNING", "COMPLETED"}
    done = stack.wait_terminal(turn_id)
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "alpha is 1, beta failed"
    assert done["counters"]["tool_calls"] == 2 and done["counters"]["iterations"] == 2

    messages = stack.messages(turn_id)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert [m["tool_call_id"] for m in messages[3:5]] == [pending[0]["id"], pending[1]["id"]]
    assert json.loads(messages[3]["content"]) == {"value": 1}
    assert json.loads(messages[4]["content"]) == {
        "code": "NOT_FOUND",
        "message": "no such key: beta",
    }
    # The model got both results with the conversation.
    counts = fake.control.get(f"/_control/models/{model}").json()["message_counts"]
    assert counts == [2, 5]

    events = stack.events(turn_id)
    assert [d["command"] for d in _of(events, "command")] == ["TOOL_RESULT", "TOOL_ERROR"]
    assert [(d["from"], d["to"]) for d in _of(events, "status_changed")] == [
        ("READY", "RUNNING"),
        ("RUNNING", "RUNNING"),
        ("RUNNING", "WAITING_FOR_TOOL"),
        ("WAITING_FOR_TOOL", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]


def test_user_message_interrupts_pending_calls(stack: Api, fake: FakeLLM, model: str) -> None:
    waiting = _waiting(stack, fake, model, TWO_CALLS, {"content": "ok, forget it"})
    turn_id = waiting["id"]
    pending = [c["id"] for c in waiting["pending_tool_calls"]]
    assert len(pending) == 2

    resumed = stack.command(
        turn_id, "messages", {"content": "never mind, just say ok", "message_id": "m-1"}
    )
    assert resumed["pending_tool_calls"] == []
    done = stack.wait_terminal(turn_id)
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "ok, forget it"

    messages = stack.messages(turn_id)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "assistant",
    ]
    assert [m["tool_call_id"] for m in messages[3:5]] == pending
    for m in messages[3:5]:
        assert m["content"] == "Tool lookup did not complete: superseded by a new user message"
    assert messages[5]["content"] == "never mind, just say ok"
    # Interrupted results are not closings of the turn: it went on and completed.
    assert messages[6]["content"] == "ok, forget it"
    counts = fake.control.get(f"/_control/models/{model}").json()["message_counts"]
    assert counts == [2, 6]

    # The same message_id again is accepted once only; the turn is finished anyway.
    r = stack.http.post(
        f"/v1/turns/{turn_id}/messages", json={"content": "again", "message_id": "m-1"}
    )
    assert r.status_code == 409 and r.json()["code"] == "turn_finished"
    assert len(stack.messages(turn_id)) == 7
