"""Messages that arrive while a turn finishes, cancels mid-call, counters shared with commands,
and the budget of external tool calls."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from app.tools.builtins import builtin_tool_spec
from tests.helpers import create_agent, create_turn, events, messages, scripted, wait_status


def _fake_model(fake_llm: str, replies: list[dict[str, Any]]) -> dict[str, Any]:
    model = f"inbox-{uuid.uuid4().hex[:10]}"
    root = fake_llm.removesuffix("/v1")
    httpx.put(f"{root}/_control/models/{model}", json={"replies": replies}).raise_for_status()
    return {"provider": "openai", "model": model, "base_url": fake_llm}


def _wait_events(client: Any, turn_id: str, type_: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e["type"] == type_ for e in events(client, turn_id)):
        assert time.monotonic() < deadline, f"no {type_} event"
        time.sleep(0.02)


def test_a_message_sent_during_the_last_model_call_is_answered(client: Any, fake_llm: str) -> None:
    # The first call takes a while and answers; a message arrives meanwhile.
    create_agent(client, "slow", _fake_model(fake_llm, [{"hang_ms": 1500}, {"content": "second"}]))
    turn = create_turn(client, "slow", "hi")
    wait_status(client, turn["id"], "RUNNING")
    r = client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "also this"})
    assert r.status_code == 202, r.text

    done = wait_status(client, turn["id"], "COMPLETED")

    assert done["output"] == "second"
    transcript = [(m["role"], m["content"]) for m in messages(client, turn["id"])]
    assert transcript == [
        ("user", "hi"),
        ("assistant", "echo: hi"),
        ("user", "also this"),
        ("assistant", "second"),
    ]
    # Two model calls and one command, none lost to the other writer.
    assert done["counters"]["steps"] == 3
    assert done["counters"]["iterations"] == 2
    completed = [
        e
        for e in events(client, turn["id"])
        if e["type"] == "status_changed" and e["data"]["to"] == "COMPLETED"
    ]
    assert len(completed) == 1


def test_cancel_mid_call_keeps_the_delivered_message_and_records_the_attempt(
    client: Any,
) -> None:
    create_agent(
        client,
        "sleepy",
        scripted(
            {"tool_calls": [{"name": "sleep", "arguments": {"ms": 1500}}]},
            {"hang_ms": 60_000},
        ),
        tools=[builtin_tool_spec("sleep")],
    )
    turn = create_turn(client, "sleepy", "go")
    _wait_events(client, turn["id"], "status_changed")
    r = client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "one more thing"})
    assert r.status_code == 202, r.text
    # The message goes into the transcript with the next model call, which hangs: it is
    # committed with that call's step, so it is not visible yet.
    _wait_events(client, turn["id"], "tool_attempt")
    time.sleep(0.3)
    client.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "stop"})

    done = wait_status(client, turn["id"], "CANCELLED")

    roles = [(m["role"], m["content"]) for m in messages(client, turn["id"])]
    assert roles[0] == ("user", "go")
    assert roles[3] == ("user", "one more thing")
    assert roles[4][0] == "assistant" and "stop" in roles[4][1]
    assert len(roles) == 5
    attempts = [
        e["data"]["outcome"] for e in events(client, turn["id"]) if e["type"] == "model_attempt"
    ]
    assert attempts == ["ok", "cancelled"]
    # model call, tool call, the message and the cancel (commands), the cancelled model call
    assert done["counters"]["steps"] == 5


def test_external_calls_over_the_tool_budget_end_the_turn(client: Any) -> None:
    ask = {
        "name": "ask",
        "description": "ask a human",
        "kind": "external",
        "parameters": {"type": "object"},
    }
    create_agent(
        client,
        "asker",
        scripted(
            {"tool_calls": [{"name": "ask", "arguments": {}}, {"name": "ask", "arguments": {}}]},
        ),
        tools=[ask],
        policy={"budget": {"max_tool_calls": 1}},
    )
    turn = create_turn(client, "asker")

    done = wait_status(client, turn["id"], "BUDGET_EXCEEDED")

    assert done["status_reason"] == "max_tool_calls (used=0, requested=2, limit=1)"
    assert done["pending_tool_calls"] == []
    closing = [m for m in messages(client, turn["id"]) if m["role"] == "tool"]
    assert len(closing) == 2  # both calls closed as interrupted


def test_a_model_answering_an_unusual_5xx_is_retried_as_server_error(client: Any) -> None:
    create_agent(
        client,
        "proxy",
        scripted({"error": {"status": 524}}, {"content": "ok"}),
        policy={"retry": {"max_retries": 1, "initial_delay_ms": 10}},
    )
    turn = create_turn(client, "proxy")

    done = wait_status(client, turn["id"], "COMPLETED")

    assert done["retry_count"] == 1
    retry = next(e for e in events(client, turn["id"]) if e["type"] == "retry_scheduled")
    assert retry["data"]["error_class"] == "server_error"


def test_a_slow_model_call_does_not_hold_up_other_turns(client: Any, fake_llm: str) -> None:
    create_agent(client, "slowpoke", _fake_model(fake_llm, [{"hang_ms": 5000}]))
    create_agent(client, "quick", scripted({"content": "done"}))
    slow = create_turn(client, "slowpoke", "take your time")
    wait_status(client, slow["id"], "RUNNING")

    quick = wait_status(client, create_turn(client, "quick")["id"], "COMPLETED")

    assert quick["output"] == "done"
    assert client.get(f"/v1/turns/{slow['id']}").json()["status"] == "RUNNING"
    wait_status(client, slow["id"], "COMPLETED")
