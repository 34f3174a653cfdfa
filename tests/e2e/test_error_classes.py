"""Every error class of RUNNER.md, produced for real by the fake model server or the tool
server, ends in the right status with the right last_error, counters, events and transcript."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import Api, FakeLLM, ToolServer

FAST_RETRY = {"max_retries": 1, "initial_delay_ms": 100, "multiplier": 2.0}


def _policy(**extra: Any) -> dict[str, Any]:
    return {"retry": FAST_RETRY, **extra}


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def _moves(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["from"], d["to"]) for d in _of(events, "status_changed")]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _check_failure(
    turn: dict[str, Any],
    *,
    source: str,
    error_class: str,
    http_status: int | None,
    code: str | None,
    retryable: bool,
) -> dict[str, Any]:
    err = turn["last_error"]
    assert err is not None, turn
    assert (
        err["source"],
        err["error_class"],
        err["http_status"],
        err["code"],
        err["retryable"],
    ) == (source, error_class, http_status, code, retryable), err
    assert err["failure_id"].startswith("fail_")
    assert "127.0.0.1" not in err["message"] and "Traceback" not in err["message"]
    return err  # type: ignore[no-any-return]


# ---- model errors ------------------------------------------------------------------------------

NOT_RETRYABLE = [
    pytest.param(
        {"error": {"status": 429, "code": "insufficient_quota"}},
        "quota_exceeded",
        429,
        "insufficient_quota",
        id="quota_exceeded",
    ),
    pytest.param(
        {
            "error": {
                "status": 400,
                "code": "context_length_exceeded",
                "message": "This model's maximum context length is 8192 tokens",
            }
        },
        "context_length_exceeded",
        400,
        "context_length_exceeded",
        id="context_length_exceeded",
    ),
    pytest.param(
        {"error": {"status": 401, "code": "invalid_api_key"}},
        "auth",
        401,
        "invalid_api_key",
        id="auth",
    ),
    pytest.param(
        {"error": {"status": 400, "message": "temperature must be <= 2"}},
        "bad_request",
        400,
        "invalid_request_error",
        id="bad_request",
    ),
    pytest.param({"malformed": True}, "invalid_response", 200, None, id="malformed"),
    pytest.param({"bad_arguments": True}, "invalid_response", None, None, id="bad_arguments"),
]


@pytest.mark.parametrize(("reply", "error_class", "http_status", "code"), NOT_RETRYABLE)
def test_non_retryable_model_error_waits_for_model(
    stack: Api,
    fake: FakeLLM,
    model: str,
    reply: dict[str, Any],
    error_class: str,
    http_status: int | None,
    code: str | None,
) -> None:
    fake.script(model, reply)
    calculator = {
        "name": "calculator",
        "description": "math",
        "kind": "builtin",
        "builtin": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    }
    # Retries are allowed, and still none is scheduled: these faults need a repair.
    stack.create_agent(
        model,
        fake.spec(model),
        tools=[calculator],
        policy=_policy(retry={**FAST_RETRY, "max_retries": 3}),
    )
    turn = stack.create_turn(model, "go")
    done = stack.wait_status(turn["id"], "WAITING_FOR_MODEL")
    _check_failure(
        done,
        source="model",
        error_class=error_class,
        http_status=http_status,
        code=code,
        retryable=False,
    )
    assert done["status_reason"].startswith(f"{error_class} (not retryable)")
    assert (done["retry_count"], done["consecutive_retry_count"]) == (0, 0)
    assert done["next_runnable_at"] is None
    assert done["counters"]["iterations"] == 0 and done["counters"]["steps"] == 1
    assert fake.requests(model) == 1

    events = stack.events(turn["id"])
    (attempt,) = _of(events, "model_attempt")
    assert (
        attempt["outcome"],
        attempt["error_class"],
        attempt["http_status"],
        attempt["code"],
    ) == ("error", error_class, http_status, code)
    assert attempt["failure_id"] == done["last_error"]["failure_id"]
    assert _of(events, "retry_scheduled") == []
    assert _moves(events) == [("READY", "RUNNING"), ("RUNNING", "WAITING_FOR_MODEL")]
    # A waiting status does not close the transcript.
    assert [m["role"] for m in stack.messages(turn["id"])] == ["user"]


def _retryable_cases(
    fake: FakeLLM,
) -> dict[str, tuple[dict[str, Any], dict[str, Any], int | None, str | None]]:
    return {
        # name: (model spec extras, scripted reply, http_status, code)
        "overloaded": ({}, {"error": {"status": 503}}, 503, "server_error"),
        "server_error": ({}, {"error": {"status": 500}}, 500, "server_error"),
        "rate_limited": (
            {},
            {"error": {"status": 429, "code": "rate_limit_exceeded"}},
            429,
            "rate_limit_exceeded",
        ),
        "timeout": ({"timeout_ms": 300}, {"hang_ms": 3000}, None, None),
        "connection": (
            {"base_url": f"http://127.0.0.1:{free_port()}/v1"},
            {"content": "never reached"},
            None,
            None,
        ),
    }


@pytest.mark.parametrize(
    "error_class", ["overloaded", "server_error", "rate_limited", "timeout", "connection"]
)
def test_retryable_model_error_is_retried_then_waits_for_model(
    stack: Api,
    fake: FakeLLM,
    model: str,
    error_class: str,
) -> None:
    extra, reply, http_status, code = _retryable_cases(fake)[error_class]
    fake.script(model, reply)
    stack.create_agent(model, fake.spec(model, **extra), policy=_policy())
    turn = stack.create_turn(model, "go")
    done = stack.wait_status(turn["id"], "WAITING_FOR_MODEL")
    _check_failure(
        done,
        source="model",
        error_class=error_class,
        http_status=http_status,
        code=code,
        retryable=True,
    )
    assert done["status_reason"].startswith(f"{error_class} (retries exhausted)")
    assert (done["retry_count"], done["consecutive_retry_count"]) == (1, 1)
    if error_class != "connection":
        assert fake.requests(model) == 2

    events = stack.events(turn["id"])
    attempts = _of(events, "model_attempt")
    assert [(a["attempt"], a["outcome"], a["error_class"], a["http_status"]) for a in attempts] == [
        (1, "error", error_class, http_status),
        (2, "error", error_class, http_status),
    ]
    (scheduled,) = _of(events, "retry_scheduled")
    assert scheduled["error_class"] == error_class and scheduled["source"] == "model"
    assert (scheduled["retry"], scheduled["max_retries"], scheduled["delay_ms"]) == (1, 1, 100)
    assert scheduled["retry_after_honoured"] is False
    assert _moves(events) == [
        ("READY", "RUNNING"),
        ("RUNNING", "RETRY_SCHEDULED"),
        ("RETRY_SCHEDULED", "RUNNING"),
        ("RUNNING", "WAITING_FOR_MODEL"),
    ]
    assert [e["by"] for e in _of(events, "retry_resumed")] == ["scheduler"]
    if error_class == "timeout":
        assert all(a["duration_ms"] < 2500 for a in attempts), attempts


def test_rate_limited_honours_retry_after(stack: Api, fake: FakeLLM, model: str) -> None:
    fake.script(
        model,
        {"error": {"status": 429, "code": "rate_limit_exceeded", "retry_after_ms": 1000}},
        {"content": "finally"},
    )
    stack.create_agent(
        model, fake.spec(model), policy=_policy(retry={**FAST_RETRY, "max_retries": 2})
    )
    turn = stack.create_turn(model, "go")
    done = stack.wait_status(turn["id"], "COMPLETED")
    assert done["output"] == "finally"
    assert (done["retry_count"], done["consecutive_retry_count"]) == (1, 0)
    assert done["last_error"] is None
    assert fake.requests(model) == 2

    events = stack.events(turn["id"])
    failed = _of(events, "model_attempt")[0]
    assert (
        failed["error_class"],
        failed["http_status"],
        failed["code"],
        failed["retry_after_ms"],
    ) == ("rate_limited", 429, "rate_limit_exceeded", 1000)
    (scheduled,) = _of(events, "retry_scheduled")
    assert scheduled["retry_after_honoured"] is True
    assert scheduled["retry_after_ms"] == 1000
    assert scheduled["computed_delay_ms"] == 100
    assert scheduled["delay_ms"] >= 1000
    # And the turn really waited that long before the next attempt.
    failed_at = next(_at(e["created_at"]) for e in events if e["type"] == "retry_scheduled")
    resumed_at = next(_at(e["created_at"]) for e in events if e["type"] == "retry_resumed")
    assert (resumed_at - failed_at).total_seconds() >= 0.8
    assert _moves(events) == [
        ("READY", "RUNNING"),
        ("RUNNING", "RETRY_SCHEDULED"),
        ("RETRY_SCHEDULED", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]


def test_an_unusual_5xx_is_a_server_error_and_retried(
    stack: Api, fake: FakeLLM, model: str
) -> None:
    # 501 with a code nobody knows: a provider-side failure, retried like a 500. (An unknown
    # error, `internal`, is never retried: tests/integration/test_internal_errors.py.)
    fake.script(model, {"error": {"status": 501, "code": "mystery"}}, {"content": "yes"})
    stack.create_agent(
        model, fake.spec(model), policy=_policy(retry={**FAST_RETRY, "max_retries": 3})
    )
    turn = stack.create_turn(model, "go")
    done = stack.wait_terminal(turn["id"])
    assert done["status"] == "COMPLETED", done
    assert done["retry_count"] == 1
    events = stack.events(turn["id"])
    assert [e["error_class"] for e in _of(events, "retry_scheduled")] == ["server_error"]
    assert fake.requests(model) == 2


# ---- tool errors -------------------------------------------------------------------------------

STRICT_PARAMS = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}

TOOL_CASES: dict[str, dict[str, Any]] = {
    # error_class: how the tool server (or the model) produces it
    "tool_timeout": {
        "path": "/slow?ms=3000",
        "timeout_ms": 300,
        "status": None,
        "retryable": True,
        "executed": True,
    },
    "tool_unavailable": {"path": "/status/503", "status": 503, "retryable": True, "executed": True},
    "tool_failed": {"path": "/status/404", "status": 404, "retryable": False, "executed": True},
    "tool_not_found": {
        "path": "/echo",
        "status": None,
        "retryable": False,
        "executed": False,
        "call": "ghost",
    },
    "invalid_arguments": {
        "path": "/echo",
        "status": None,
        "retryable": False,
        "executed": False,
        "arguments": {"n": "five"},
    },
}


def _tool_agent(
    stack: Api,
    fake: FakeLLM,
    tools: ToolServer,
    model: str,
    case: dict[str, Any],
    policy: dict[str, Any],
) -> str:
    tool: dict[str, Any] = {
        "name": "remote",
        "description": "a remote tool",
        "kind": "http",
        "url": tools.url(case["path"]),
        "parameters": STRICT_PARAMS,
    }
    if case.get("timeout_ms"):
        tool["timeout_ms"] = case["timeout_ms"]
    fake.script(
        model,
        {
            "tool_calls": [
                {"name": case.get("call", "remote"), "arguments": case.get("arguments", {"n": 5})}
            ]
        },
        {"content": "done"},
    )
    stack.create_agent(model, fake.spec(model), tools=[tool], policy=policy)
    return model


@pytest.mark.parametrize("error_class", list(TOOL_CASES))
def test_tool_error_under_fail_run(
    stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str, error_class: str
) -> None:
    case = TOOL_CASES[error_class]
    agent = _tool_agent(stack, fake, tool_server, model, case, _policy())
    turn = stack.create_turn(agent, "use the tool")
    done = stack.wait_terminal(turn["id"])
    assert done["status"] == "FAILED", done
    err = _check_failure(
        done,
        source="tool",
        error_class=error_class,
        http_status=case["status"],
        code=None,
        retryable=case["retryable"],
    )
    why = "retries exhausted" if case["retryable"] else "not retryable"
    assert done["status_reason"].startswith(f"{error_class} ({why})")
    attempts = 2 if case["retryable"] else 1
    assert done["retry_count"] == attempts - 1
    assert done["counters"]["tool_calls"] == (attempts if case["executed"] else 0)
    assert fake.requests(model) == 1  # the model is never asked again

    events = stack.events(turn["id"])
    tool_attempts = _of(events, "tool_attempt")
    assert [(a["outcome"], a["error_class"]) for a in tool_attempts] == [
        ("error", error_class)
    ] * attempts
    assert tool_attempts[-1]["failure_id"] == err["failure_id"]
    assert len(_of(events, "retry_scheduled")) == attempts - 1
    assert _moves(events)[-1] == ("RUNNING", "FAILED")

    # Each execution of the same call carried the same idempotency key.
    seen = tool_server.requests(turn["id"])
    assert len(seen) == (attempts if case["executed"] else 0)
    call_id = stack.messages(turn["id"])[1]["tool_calls"][0]["id"]
    assert {r["idempotency_key"] for r in seen} <= {f"{turn['id']}:{call_id}"}

    # Closed exactly once: the open call gets its interrupted result, then one assistant.
    messages = stack.messages(turn["id"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_call_id"] == call_id
    assert messages[2]["content"].startswith(
        f"Tool {case.get('call', 'remote')} did not complete: {error_class}"
    )
    assert messages[3]["content"].startswith(f"This turn ended before completion: {error_class}")


@pytest.mark.parametrize("error_class", list(TOOL_CASES))
def test_tool_error_returned_to_model(
    stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str, error_class: str
) -> None:
    case = TOOL_CASES[error_class]
    template = "ERROR {code} in {tool_name} ({tool_call_id}): {message}"
    policy = _policy(
        retry={**FAST_RETRY, "max_retries": 3},
        tool_error_strategy="RETURN_ERROR_TO_MODEL",
        tool_error_message_template=template,
    )
    agent = _tool_agent(stack, fake, tool_server, model, case, policy)
    turn = stack.create_turn(agent, "use the tool")
    done = stack.wait_terminal(turn["id"])
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "done"
    assert (done["retry_count"], done["consecutive_retry_count"]) == (0, 0)
    assert done["last_error"] is None
    assert done["counters"]["iterations"] == 2
    assert done["counters"]["tool_calls"] == (1 if case["executed"] else 0)

    events = stack.events(turn["id"])
    assert _of(events, "retry_scheduled") == []
    (attempt,) = _of(events, "tool_attempt")
    assert (attempt["outcome"], attempt["error_class"]) == ("error", error_class)
    assert "RETRY_SCHEDULED" not in {to for _, to in _moves(events)}
    # Never retried: the tool ran at most once.
    assert len(tool_server.requests(turn["id"])) == (1 if case["executed"] else 0)

    messages = stack.messages(turn["id"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    call = messages[1]["tool_calls"][0]
    tool_message = messages[2]
    assert tool_message["tool_call_id"] == call["id"]
    # The message is escaped for a JSON string, as the default template needs.
    escaped = attempt["message"].replace("\\", "\\\\").replace('"', '\\"')
    assert tool_message["content"] == (
        f"ERROR {error_class} in {call['name']} ({call['id']}): {escaped}"
    )
    assert "127.0.0.1" not in tool_message["content"]
    # The model saw the error as the tool's result: user, assistant, tool.
    assert fake.control.get(f"/_control/models/{model}").json()["message_counts"] == [1, 3]


def test_default_tool_error_template_is_json(
    stack: Api, fake: FakeLLM, tool_server: ToolServer, model: str
) -> None:
    policy = _policy(tool_error_strategy="RETURN_ERROR_TO_MODEL")
    agent = _tool_agent(stack, fake, tool_server, model, TOOL_CASES["tool_failed"], policy)
    turn = stack.create_turn(agent, "use the tool")
    assert stack.wait_terminal(turn["id"])["status"] == "COMPLETED"
    content = json.loads(stack.messages(turn["id"])[2]["content"])
    assert content["code"] == "tool_failed"
    assert content["message"].startswith("tool answered HTTP 404")
