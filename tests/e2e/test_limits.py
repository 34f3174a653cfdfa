"""Limits of the execution policy, each tripping where RUNNER.md says, with a closed transcript."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Api, FakeLLM, ToolServer

ECHO_PARAMS = {"type": "object", "properties": {"text": {"type": "string"}}}
CALL_TOOL = {"tool_calls": [{"name": "echo", "arguments": {"text": "again"}}]}


def _echo_tool(tools: ToolServer) -> dict[str, Any]:
    return {
        "name": "echo",
        "description": "echo",
        "kind": "http",
        "url": tools.url("/echo"),
        "parameters": ECHO_PARAMS,
    }


def _roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def _assert_closed_once(messages: list[dict[str, Any]], reason: str) -> None:
    """Every tool call has exactly one result, and one closing assistant message ends it."""
    calls = [
        c["id"] for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])
    ]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert sorted(calls) == sorted(results), messages
    closing = [
        m
        for m in messages
        if m["role"] == "assistant"
        and m["content"]
        and m["content"].startswith("This turn ended before completion:")
    ]
    assert len(closing) == 1 and closing[0] is messages[-1], messages
    assert messages[-1]["content"] == f"This turn ended before completion: {reason}"


def _run(
    stack: Api,
    fake: FakeLLM,
    model: str,
    tools: list[dict[str, Any]],
    policy: dict[str, Any],
    *replies: dict[str, Any],
) -> dict[str, Any]:
    fake.script(model, *replies)
    stack.create_agent(model, fake.spec(model), tools=tools, policy=policy)
    turn = stack.create_turn(model, "loop")
    return stack.wait_terminal(turn["id"])


def test_model_that_keeps_calling_tools_hits_max_iterations(
    stack: Api,
    fake: FakeLLM,
    tool_server: ToolServer,
    model: str,
) -> None:
    done = _run(stack, fake, model, [_echo_tool(tool_server)], {"max_iterations": 3}, CALL_TOOL)
    assert done["status"] == "MAX_ITERATIONS_REACHED", done
    reason = "max_iterations (used=3, limit=3)"
    assert done["status_reason"] == reason
    assert done["counters"]["iterations"] == 3 and done["counters"]["tool_calls"] == 3
    assert fake.requests(model) == 3  # no fourth model call
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    _assert_closed_once(messages, reason)


def test_token_budget(stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str) -> None:
    reply = {**CALL_TOOL, "usage": {"input_tokens": 400, "output_tokens": 100}}
    done = _run(
        stack, fake, model, [_echo_tool(tool_server)], {"budget": {"max_total_tokens": 800}}, reply
    )
    assert done["status"] == "BUDGET_EXCEEDED", done
    reason = "max_total_tokens (used=1000, limit=800)"
    assert done["status_reason"] == reason
    assert done["counters"]["total_tokens"] == 1000
    assert (done["counters"]["input_tokens"], done["counters"]["output_tokens"]) == (800, 200)
    # The second answer asked for a tool; the budget stopped it before it ran.
    assert done["counters"]["tool_calls"] == 1
    assert len(tool_server.requests(done["id"])) == 1
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[4]["content"].startswith("Tool echo did not complete: max_total_tokens")
    _assert_closed_once(messages, reason)


def test_max_steps(stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str) -> None:
    # model (1), tool (2), model (3) — and the fourth step is refused.
    done = _run(stack, fake, model, [_echo_tool(tool_server)], {"max_steps": 3}, CALL_TOOL)
    assert done["status"] == "MAX_STEPS_REACHED", done
    reason = "max_steps (used=3, limit=3)"
    assert done["status_reason"] == reason
    assert done["counters"]["steps"] == 3
    assert fake.requests(model) == 2
    assert len(tool_server.requests(done["id"])) == 1
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    _assert_closed_once(messages, reason)


def test_max_tool_calls(stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str) -> None:
    done = _run(
        stack, fake, model, [_echo_tool(tool_server)], {"budget": {"max_tool_calls": 2}}, CALL_TOOL
    )
    assert done["status"] == "BUDGET_EXCEEDED", done
    reason = "max_tool_calls (used=2, limit=2)"
    assert done["status_reason"] == reason
    assert done["counters"]["tool_calls"] == 2
    assert len(tool_server.requests(done["id"])) == 2  # the third never ran
    assert fake.requests(model) == 3
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    _assert_closed_once(messages, reason)


def test_max_duration_cuts_a_slow_tool(
    stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str
) -> None:
    slow = {
        "name": "slow",
        "description": "slow",
        "kind": "http",
        "url": tool_server.url("/slow?ms=8000"),
        "parameters": ECHO_PARAMS,
        "timeout_ms": 30_000,
    }
    done = _run(
        stack,
        fake,
        model,
        [slow],
        {"budget": {"max_duration_ms": 2000}},
        {"tool_calls": [{"name": "slow", "arguments": {}}]},
        {"content": "never"},
    )
    assert done["status"] == "BUDGET_EXCEEDED", done
    assert done["status_reason"].startswith("max_duration_ms (used="), done["status_reason"]
    assert done["status_reason"].endswith(", limit=2000)")
    used = int(done["status_reason"].split("used=")[1].split(",")[0])
    assert 2000 <= used < 6000
    assert len(tool_server.requests(done["id"])) == 1
    assert fake.requests(model) == 1

    events = stack.events(done["id"])
    (attempt,) = [e["data"] for e in events if e["type"] == "tool_attempt"]
    # The call was cut to what was left of the 2 s, far below its own 30 s timeout.
    assert attempt["error_class"] == "tool_timeout"
    assert attempt["duration_ms"] < 2500
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"].startswith("Tool slow did not complete: max_duration_ms")
    _assert_closed_once(messages, done["status_reason"])


def test_max_duration_cuts_a_hanging_model_call(stack: Api, fake: FakeLLM, model: str) -> None:
    done = _run(
        stack,
        fake,
        model,
        [],
        {"budget": {"max_duration_ms": 1500}, "retry": {"max_retries": 3, "initial_delay_ms": 100}},
        {"hang_ms": 4000},
    )
    assert done["status"] == "BUDGET_EXCEEDED", done
    assert done["status_reason"].startswith("max_duration_ms (used=")
    assert done["retry_count"] == 0  # running out of time is not a fault to retry
    events = stack.events(done["id"])
    (attempt,) = [e["data"] for e in events if e["type"] == "model_attempt"]
    assert attempt["error_class"] == "timeout" and attempt["duration_ms"] < 2000
    messages = stack.messages(done["id"])
    assert _roles(messages) == ["user", "assistant"]
    _assert_closed_once(messages, done["status_reason"])
