"""Fixes from a review, over HTTP on both databases: who may point a turn at another model
endpoint, a user message closing a failed tool call, an external tool's error under FAIL_RUN,
SSE `Last-Event-ID`, unknown builtins, and `next_after` on the event log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.api import turns as turns_api
from app.tools import registry
from tests.conftest import api_client
from tests.helpers import (
    CALCULATOR,
    TERMINAL,
    create_agent,
    create_turn,
    events,
    messages,
    scripted,
)

CLIENT = {"Authorization": "Bearer c1"}
ADMIN = {"Authorization": "Bearer a1"}

EXTERNAL = {
    "name": "lookup",
    "description": "Look something up (the client does).",
    "kind": "external",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
ASK_TWO = {
    "tool_calls": [
        {"name": "lookup", "arguments": {"q": "a"}},
        {"name": "lookup", "arguments": {"q": "b"}},
    ]
}
TO_MODEL = {"tool_error_strategy": "RETURN_ERROR_TO_MODEL"}


def wait_status(
    c: Any,
    turn_id: str,
    statuses: set[str] | str,
    headers: dict[str, str] | None = None,
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    """Poll the turn until it is in one of `statuses`; fail at once on another terminal one."""
    wanted = {statuses} if isinstance(statuses, str) else statuses
    deadline = time.monotonic() + timeout_s
    turn: dict[str, Any] = {}
    while time.monotonic() < deadline:
        turn = c.get(f"/v1/turns/{turn_id}", headers=headers or {}).json()
        if turn["status"] in wanted:
            return turn
        assert turn["status"] not in TERMINAL, f"ended {turn['status']}, wanted {wanted}: {turn}"
        time.sleep(0.02)
    raise AssertionError(f"turn {turn_id} never reached {wanted}; last: {turn}")


def accepted(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["detail"]
    return body


def snapshot(c: Any, turn_id: str, headers: dict[str, str] | None = None) -> tuple[Any, ...]:
    h = headers or {}
    return (
        c.get(f"/v1/turns/{turn_id}", headers=h).json(),
        c.get(f"/v1/turns/{turn_id}/messages", headers=h).json(),
        c.get(f"/v1/turns/{turn_id}/events", headers=h).json(),
    )


# ---- 1. retry-model: a client token may not move the turn to another endpoint or key -------

BASE = "http://127.0.0.1:9/v1"
# Not set in the environment: every call fails at once as `auth`, which parks the turn in
# WAITING_FOR_MODEL without any network traffic.
KEY_ENV = "TR_REVIEW_FIXES_UNSET_KEY"
OPENAI = {"provider": "openai", "model": "gpt-x", "base_url": BASE, "api_key_env": KEY_ENV}


@pytest.fixture
def secured(db_url: str) -> Iterator[Any]:
    with api_client(db_url, api_tokens="c1", admin_tokens="a1") as c:
        yield c


def _parked(c: Any) -> dict[str, Any]:
    create_agent(c, "remote", OPENAI, policy={"retry": {"max_retries": 0}}, headers=ADMIN)
    turn = create_turn(c, "remote", headers=CLIENT)
    parked = wait_status(c, turn["id"], "WAITING_FOR_MODEL", headers=CLIENT)
    assert parked["last_error"]["error_class"] == "auth"
    return parked


def _retry_model(
    c: Any, turn: dict[str, Any], model: dict[str, Any], form: str, headers: dict[str, str]
) -> httpx.Response:
    failure_id = turn["last_error"]["failure_id"]
    if form == "retry-model":
        return c.post(
            f"/v1/turns/{turn['id']}/retry-model",
            json={"failure_id": failure_id, "model": model},
            headers=headers,
        )
    return c.post(
        f"/v1/turns/{turn['id']}/resume",
        json={"command": "RETRY_MODEL", "failure_id": failure_id, "model": model},
        headers=headers,
    )


def _models_called(c: Any, turn_id: str) -> list[str]:
    log = c.get(f"/v1/turns/{turn_id}/events", headers=ADMIN).json()["items"]
    return [e["data"]["model"] for e in log if e["type"] == "model_attempt"]


@pytest.mark.parametrize("form", ["retry-model", "resume"])
def test_client_token_may_not_point_a_turn_at_another_endpoint_or_key(
    secured: Any, form: str
) -> None:
    turn = _parked(secured)
    before = snapshot(secured, turn["id"], ADMIN)
    refused = {
        "base_url": ({**OPENAI, "base_url": "https://attacker.example/v1"}, ["base_url"]),
        "api_key_env": ({**OPENAI, "api_key_env": "OTHER_KEY"}, ["api_key_env"]),
        "no api_key_env": (
            {k: v for k, v in OPENAI.items() if k != "api_key_env"},
            ["api_key_env"],
        ),
        "no base_url": ({k: v for k, v in OPENAI.items() if k != "base_url"}, ["base_url"]),
        "both": (
            {**OPENAI, "base_url": "https://attacker.example/v1", "api_key_env": "OTHER_KEY"},
            ["base_url", "api_key_env"],
        ),
        "provider": (scripted({"content": "hi"}), ["provider", "base_url", "api_key_env"]),
    }
    for case, (model, fields) in refused.items():
        answer = problem(_retry_model(secured, turn, model, form, CLIENT), 403, "forbidden")
        assert "admin" in answer["detail"], case
        assert answer["fields"] == fields, case
        assert snapshot(secured, turn["id"], ADMIN) == before, case
    assert "attacker" not in json.dumps(before)


@pytest.mark.parametrize("form", ["retry-model", "resume"])
def test_client_token_may_switch_the_model_on_the_same_endpoint(secured: Any, form: str) -> None:
    turn = _parked(secured)
    other = {**OPENAI, "model": "gpt-y", "timeout_ms": 5000, "params": {"temperature": 0}}
    resumed = accepted(_retry_model(secured, turn, other, form, CLIENT))
    assert resumed["status"] == "RUNNING"
    again = wait_status(secured, turn["id"], "WAITING_FOR_MODEL", headers=CLIENT)
    assert _models_called(secured, turn["id"]) == ["gpt-x", "gpt-y"]
    # Judged against the turn's current model (now the override): still its endpoint only.
    moved = {**other, "model": "gpt-z", "base_url": "https://attacker.example/v1"}
    problem(_retry_model(secured, again, moved, form, CLIENT), 403, "forbidden")
    third = {**other, "model": "gpt-z"}
    accepted(_retry_model(secured, again, third, form, CLIENT))
    wait_status(secured, turn["id"], "WAITING_FOR_MODEL", headers=CLIENT)
    assert _models_called(secured, turn["id"]) == ["gpt-x", "gpt-y", "gpt-z"]


def test_client_token_may_switch_a_scripted_model(secured: Any) -> None:
    create_agent(
        secured,
        "stuck",
        scripted({"error": {"status": 503}}),
        policy={"retry": {"max_retries": 0}},
        headers=ADMIN,
    )
    turn = create_turn(secured, "stuck", headers=CLIENT)
    parked = wait_status(secured, turn["id"], "WAITING_FOR_MODEL", headers=CLIENT)
    backup = {**scripted({"content": "unused"}, {"content": "from backup"}), "model": "backup"}
    accepted(_retry_model(secured, parked, backup, "retry-model", CLIENT))
    done = wait_status(secured, turn["id"], "COMPLETED", headers=CLIENT)
    assert done["output"] == "from backup"


def test_admin_token_may_switch_to_any_endpoint(secured: Any) -> None:
    turn = _parked(secured)
    elsewhere = {
        "provider": "openai",
        "model": "gpt-elsewhere",
        "base_url": "http://127.0.0.1:9/other/v1",
        "api_key_env": "TR_REVIEW_FIXES_OTHER_UNSET_KEY",
    }
    resumed = accepted(_retry_model(secured, turn, elsewhere, "retry-model", ADMIN))
    assert resumed["status"] == "RUNNING"
    parked = wait_status(secured, turn["id"], "WAITING_FOR_MODEL", headers=CLIENT)
    assert "TR_REVIEW_FIXES_OTHER_UNSET_KEY" in parked["last_error"]["message"]
    # ... and to another provider altogether
    local = scripted({"content": "x"}, {"content": "y"}, {"content": "by admin"})
    accepted(_retry_model(secured, parked, local, "resume", ADMIN))
    done = wait_status(secured, turn["id"], "COMPLETED", headers=CLIENT)
    assert done["output"] == "by admin"
    assert _models_called(secured, turn["id"]) == ["gpt-x", "gpt-elsewhere", "script"]


@pytest.mark.parametrize(
    "name", ["TURNRUNNER_ADMIN_TOKENS", "turnrunner_api_tokens", "TurnRunner_DATABASE_URL"]
)
def test_api_key_env_may_not_name_the_services_own_settings(api_only: Any, name: str) -> None:
    body = {"name": "leaky", "tools": [], "model": {**OPENAI, "api_key_env": name}}
    answer = problem(api_only.post("/v1/agents", json=body), 422, "validation_error")
    assert "body.model.api_key_env" in [e["field"] for e in answer["errors"]], answer
    assert api_only.get("/v1/agents/leaky").status_code == 404
    # the same for a model given to retry-model
    r = api_only.post(
        "/v1/turns/turn_any/retry-model",
        json={"failure_id": "f", "model": {**OPENAI, "api_key_env": name}},
    )
    answer = problem(r, 422, "validation_error")
    assert "body.model.api_key_env" in [e["field"] for e in answer["errors"]], answer


# ---- 2. a user message closes a tool call whose retry was scheduled -------------------------


def test_user_message_in_retry_scheduled_closes_the_failed_tool_call(client: Any) -> None:
    closed_port = {
        "name": "fetch",
        "description": "Fetch something.",
        "kind": "http",
        "url": "http://127.0.0.1:9/",
    }
    create_agent(
        client,
        "fetcher",
        scripted({"tool_calls": [{"name": "fetch", "arguments": {}}]}, {"content": "ok"}),
        tools=[closed_port],
        policy={"retry": {"max_retries": 3, "initial_delay_ms": 60_000}},
    )
    turn = create_turn(client, "fetcher")
    parked = wait_status(client, turn["id"], "RETRY_SCHEDULED")
    assert parked["last_error"]["source"] == "tool"
    asked = messages(client, turn["id"])[-1]
    assert asked["role"] == "assistant"
    call = asked["tool_calls"][0]["id"]

    resumed = accepted(
        client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "never mind"})
    )
    assert resumed["status"] == "RUNNING"
    assert resumed["next_runnable_at"] is None
    assert resumed["pending_tool_calls"] == []

    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "ok"
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "user", "assistant"]
    assert msgs[2]["tool_call_id"] == call
    assert msgs[2]["content"] == "Tool fetch did not complete: superseded by a new user message"
    assert msgs[3]["content"] == "never mind"
    assert msgs[4]["content"] == "ok"
    log = events(client, turn["id"])
    assert len([e for e in log if e["type"] == "tool_attempt"]) == 1
    assert [e["data"]["outcome"] for e in log if e["type"] == "model_attempt"] == ["ok", "ok"]


# ---- 3. an external tool's error and tool_error_strategy ------------------------------------


@pytest.mark.parametrize("form", ["tool-results", "resume"])
def test_external_tool_error_fails_the_turn_under_fail_run(client: Any, form: str) -> None:
    create_agent(client, "asks", scripted(ASK_TWO, {"content": "never"}), tools=[EXTERNAL])
    turn = create_turn(client, "asks")
    waiting = wait_status(client, turn["id"], "WAITING_FOR_TOOL")
    first, second = (c["id"] for c in waiting["pending_tool_calls"])
    error = {"code": "not_found", "message": "no such record at http://10.1.2.3:8080/x"}
    if form == "tool-results":
        r = client.post(
            f"/v1/turns/{turn['id']}/tool-results", json={"tool_call_id": first, "error": error}
        )
    else:
        r = client.post(
            f"/v1/turns/{turn['id']}/resume",
            json={"command": "TOOL_ERROR", "tool_call_id": first, "error": error},
        )
    failed = accepted(r)
    reason = "tool_failed (external tool reported not_found): no such record at <url>"
    assert failed["status"] == "FAILED"
    assert failed["status_reason"] == reason
    assert failed["finished_at"] is not None
    assert failed["pending_tool_calls"] == []
    assert failed["counters"]["tool_calls"] == 1
    last = failed["last_error"]
    assert (last["source"], last["error_class"], last["code"]) == (
        "tool",
        "tool_failed",
        "not_found",
    )
    assert last["message"] == "no such record at <url>"
    assert last["retryable"] is False
    assert last["failure_id"]

    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m["tool_call_id"] for m in msgs[2:4]] == [first, second]
    assert msgs[2]["content"] == f"Tool lookup did not complete: {reason}"
    assert msgs[3]["content"] == f"Tool lookup did not complete: {reason}"
    assert msgs[4]["content"] == f"This turn ended before completion: {reason}"
    assert "10.1.2.3" not in json.dumps([failed, msgs])

    log = events(client, turn["id"])
    moves = [(e["data"]["from"], e["data"]["to"]) for e in log if e["type"] == "status_changed"]
    assert moves[-2:] == [("WAITING_FOR_TOOL", "RUNNING"), ("RUNNING", "FAILED")]
    assert [e["data"]["command"] for e in log if e["type"] == "command"] == ["TOOL_ERROR"]
    assert len([e for e in log if e["type"] == "model_attempt"]) == 1  # no model call after

    # finished: the other call's result is refused and nothing runs on
    before = snapshot(client, turn["id"])
    problem(
        client.post(
            f"/v1/turns/{turn['id']}/tool-results", json={"tool_call_id": second, "content": "x"}
        ),
        409,
        "turn_finished",
    )
    time.sleep(0.2)
    assert snapshot(client, turn["id"]) == before


def test_external_tool_error_goes_to_the_model_under_return_error_to_model(client: Any) -> None:
    create_agent(
        client, "asks", scripted(ASK_TWO, {"content": "done"}), tools=[EXTERNAL], policy=TO_MODEL
    )
    turn = create_turn(client, "asks")
    waiting = wait_status(client, turn["id"], "WAITING_FOR_TOOL")
    first, second = (c["id"] for c in waiting["pending_tool_calls"])
    half = accepted(
        client.post(
            f"/v1/turns/{turn['id']}/tool-results",
            json={"tool_call_id": first, "error": {"code": "not_found", "message": "no record"}},
        )
    )
    assert half["status"] == "WAITING_FOR_TOOL"
    assert [c["id"] for c in half["pending_tool_calls"]] == [second]
    assert half["last_error"] is None
    resumed = accepted(
        client.post(
            f"/v1/turns/{turn['id']}/tool-results", json={"tool_call_id": second, "content": "b"}
        )
    )
    assert resumed["status"] == "RUNNING"
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "done"
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert json.loads(msgs[2]["content"]) == {"code": "not_found", "message": "no record"}
    assert msgs[3]["content"] == "b"


# ---- 4. SSE Last-Event-ID -------------------------------------------------------------------


def read_sse(c: Any, path: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """A whole event stream's events (the turn is finished, so the stream ends)."""
    out: list[dict[str, Any]] = []
    with c.stream("GET", path, headers={"Accept": "text/event-stream", **headers}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        frame: dict[str, str] = {}
        for line in [*r.iter_lines(), ""]:
            if line.startswith(":"):
                continue
            if line:
                key, _, value = line.partition(":")
                frame[key] = value.removeprefix(" ")
            elif frame:
                data = json.loads(frame["data"])
                assert int(frame["id"]) == data["seq"]
                out.append(data)
                frame = {}
    return out


def test_event_stream_starts_after_last_event_id(client: Any) -> None:
    create_agent(
        client,
        "calc",
        scripted(
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}]},
            {"content": "2"},
        ),
        tools=[CALCULATOR],
    )
    turn = create_turn(client, "calc")
    wait_status(client, turn["id"], "COMPLETED")
    log = events(client, turn["id"])
    assert len(log) > 6
    path = f"/v1/turns/{turn['id']}/events"
    assert read_sse(client, path, {}) == log
    assert read_sse(client, path, {"Last-Event-ID": "3"}) == log[3:]
    assert read_sse(client, path, {"last-event-id": " 4 "}) == log[4:]
    # the larger of `after` and Last-Event-ID
    assert read_sse(client, path + "?after=5", {"Last-Event-ID": "2"}) == log[5:]
    assert read_sse(client, path + "?after=2", {"Last-Event-ID": "5"}) == log[5:]
    assert read_sse(client, path, {"Last-Event-ID": str(log[-1]["seq"])}) == []
    # not a sequence number: ignored
    for junk in ("abc", "-3", "1.5", "", "9" * 30):
        assert read_sse(client, path + "?after=1", {"Last-Event-ID": junk}) == log[1:], junk
    # the JSON form pages with `after` only
    r = client.get(path, headers={"Last-Event-ID": "3"})
    assert r.status_code == 200
    assert r.json()["items"] == log


# ---- 5. unknown builtins --------------------------------------------------------------------


def test_builtin_tool_must_name_a_registered_builtin(api_only: Any) -> None:
    unknown = {
        "name": "mystery",
        "description": "Not registered anywhere.",
        "kind": "builtin",
        "builtin": "no_such_builtin",
    }
    body = {
        "name": "bad",
        "model": scripted({"content": "x"}),
        "tools": [CALCULATOR, unknown],
    }
    answer = problem(api_only.post("/v1/agents", json=body), 422, "validation_error")
    assert [e["field"] for e in answer["errors"]] == ["body.tools.1.builtin"]
    assert "no_such_builtin" in answer["errors"][0]["message"]
    assert answer["detail"].startswith("body.tools.1.builtin")
    assert api_only.get("/v1/agents/bad").status_code == 404
    assert api_only.get("/v1/agents").json()["items"] == []

    registry.register_builtin("no_such_builtin", lambda arguments, context: "now there is")
    try:
        r = api_only.post("/v1/agents", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["tools"][1]["builtin"] == "no_such_builtin"
    finally:
        registry.unregister_builtin("no_such_builtin")


# ---- 6. next_after on the JSON event log ----------------------------------------------------


def test_event_page_says_when_more_may_follow(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    create_agent(client, "quick", scripted({"content": "hi"}))
    turn = create_turn(client, "quick")
    wait_status(client, turn["id"], "COMPLETED")
    path = f"/v1/turns/{turn['id']}/events"
    whole = client.get(path).json()
    log = whole["items"]
    assert whole["next_after"] is None  # a small log fits one page
    assert len(log) >= 4

    # exactly one full page: more may follow, so next_after is its last seq
    monkeypatch.setattr(turns_api, "EVENT_PAGE", len(log))
    page = client.get(path).json()
    assert page == {"items": log, "next_after": log[-1]["seq"]}
    assert client.get(path, params={"after": page["next_after"]}).json() == {
        "items": [],
        "next_after": None,
    }

    # small pages: following next_after walks the whole log, each event once
    monkeypatch.setattr(turns_api, "EVENT_PAGE", 3)
    walked: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = client.get(path, params={"after": after}).json()
        assert len(page["items"]) <= 3
        walked += page["items"]
        after = page["next_after"]
        if after is not None:
            assert after == page["items"][-1]["seq"]
    assert walked == log
    # the stream reads page after page too, and sends all of it
    assert read_sse(client, path, {}) == log
