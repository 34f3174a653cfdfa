"""Turn commands over HTTP on both databases (API.md, Commands): each command's happy path,
every status it does not fit answering its 409 code and changing nothing, and the
consecutive_retry_count rules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.conftest import api_client
from tests.helpers import CALCULATOR, TERMINAL, create_agent, create_turn, events, messages
from tests.helpers import scripted as _scripted

EXTERNAL = {
    "name": "lookup",
    "description": "Look something up (the client does).",
    "kind": "external",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
PARK_MODEL = {"retry": {"max_retries": 0}}
LATER = {"retry": {"max_retries": 1, "initial_delay_ms": 60_000, "max_delay_ms": 60_000}}
AT_ONCE = {"retry": {"max_retries": 1, "initial_delay_ms": 0, "max_delay_ms": 0}}
OVERLOADED = {"error": {"status": 503}}
ASK_TWO = {
    "tool_calls": [
        {"name": "lookup", "arguments": {"q": "a"}},
        {"name": "lookup", "arguments": {"q": "b"}},
    ]
}


def scripted(*replies: dict[str, Any], model: str = "script") -> dict[str, Any]:
    return {**_scripted(*replies), "model": model}


def wait_status(
    c: Any, turn_id: str, statuses: set[str] | str, timeout_s: float = 20.0
) -> dict[str, Any]:
    """Poll the turn until it is in one of `statuses`; fail at once on another terminal one."""
    wanted = {statuses} if isinstance(statuses, str) else statuses
    deadline = time.monotonic() + timeout_s
    turn: dict[str, Any] = {}
    while time.monotonic() < deadline:
        turn = c.get(f"/v1/turns/{turn_id}").json()
        if turn["status"] in wanted:
            return turn
        assert turn["status"] not in TERMINAL, f"ended {turn['status']}, wanted {wanted}: {turn}"
        time.sleep(0.02)
    raise AssertionError(f"turn {turn_id} never reached {wanted}; last: {turn}")


def make_agents(c: Any) -> None:
    create_agent(c, "flaky", scripted(OVERLOADED, {"content": "recovered"}), policy=PARK_MODEL)
    create_agent(c, "later", scripted(OVERLOADED, {"content": "recovered"}), policy=LATER)
    create_agent(
        c, "twice", scripted(OVERLOADED, OVERLOADED, {"content": "recovered"}), policy=AT_ONCE
    )
    create_agent(c, "asks", scripted(ASK_TWO, {"content": "done"}), tools=[EXTERNAL])
    create_agent(c, "quick", scripted({"content": "hi"}))


def park(c: Any, agent: str, status: str, input_: str = "hi") -> dict[str, Any]:
    turn = create_turn(c, agent, input_)
    return wait_status(c, turn["id"], status)


def running_held(c: Any) -> dict[str, Any]:
    """A RUNNING turn its worker holds: the tool step is committed, then the model never
    answers (the hang is on the second call, so RUNNING is already durable)."""
    model = {
        **scripted(
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}]},
            {"hang_ms": 600_000},
        ),
        "timeout_ms": 600_000,
    }
    create_agent(c, "hangs", model, tools=[CALCULATOR])
    turn = create_turn(c, "hangs")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = c.get(f"/v1/turns/{turn['id']}").json()
        if now["status"] == "RUNNING" and now["counters"]["tool_calls"] == 1:
            return now  # type: ignore[no-any-return]
        assert now["status"] not in TERMINAL, now
        time.sleep(0.02)
    raise AssertionError(f"turn never got to its hanging model call: {now}")


def snapshot(c: Any, turn_id: str) -> tuple[Any, ...]:
    return (c.get(f"/v1/turns/{turn_id}").json(), messages(c, turn_id), events(c, turn_id))


def accepted(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 202, r.text
    return r.json()  # type: ignore[no-any-return]


def problem(r: httpx.Response, code: str, status: int = 409) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status
    return body


def when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value.replace("Z", "+00:00"))


def command_events(c: Any, turn_id: str) -> list[str]:
    return [e["data"]["command"] for e in events(c, turn_id) if e["type"] == "command"]


# ---- the wrong-status matrix -------------------------------------------------------------


@pytest.fixture
def zoo(db_url: str) -> Iterator[tuple[Any, dict[str, dict[str, Any]]]]:
    """One turn in every status a command can meet. One worker slot, held by a turn whose
    model never answers, so the READY turn stays READY and nothing moves by itself."""
    with api_client(db_url, worker_concurrency=1) as c:
        make_agents(c)
        create_agent(
            c,
            "fails",
            scripted({"tool_calls": [{"name": "calculator", "arguments": {"expression": "1/"}}]}),
            tools=[CALCULATOR],
        )
        create_agent(
            c,
            "loops",
            scripted({"tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}]}),
            tools=[CALCULATOR],
            policy={"max_iterations": 1},
        )
        turns = {
            "WAITING_FOR_MODEL": park(c, "flaky", "WAITING_FOR_MODEL"),
            "RETRY_SCHEDULED": park(c, "later", "RETRY_SCHEDULED"),
            "WAITING_FOR_TOOL": park(c, "asks", "WAITING_FOR_TOOL"),
            "COMPLETED": park(c, "quick", "COMPLETED"),
            "FAILED": park(c, "fails", "FAILED"),
            "MAX_ITERATIONS_REACHED": park(c, "loops", "MAX_ITERATIONS_REACHED"),
        }
        cancelled = park(c, "asks", "WAITING_FOR_TOOL")
        accepted(c.post(f"/v1/turns/{cancelled['id']}/cancel", json={}))
        turns["CANCELLED"] = c.get(f"/v1/turns/{cancelled['id']}").json()
        turns["RUNNING"] = running_held(c)
        # the only worker slot is taken by the hanging turn: this one stays READY, unclaimed
        turns["READY"] = create_turn(c, "quick")
        try:
            yield c, turns
        finally:
            c.post(f"/v1/turns/{turns['RUNNING']['id']}/cancel", json={})
            wait_status(c, turns["RUNNING"]["id"], "CANCELLED")


TERMINAL_ZOO = ("COMPLETED", "FAILED", "MAX_ITERATIONS_REACHED", "CANCELLED")
LIVE_ZOO = ("READY", "RUNNING", "RETRY_SCHEDULED", "WAITING_FOR_MODEL", "WAITING_FOR_TOOL")


def _failure_id(turn: dict[str, Any]) -> str:
    return (turn["last_error"] or {}).get("failure_id") or "fail_none"


def _call_id(c: Any, turn: dict[str, Any]) -> str:
    r = c.get(f"/v1/turns/{turn['id']}/messages")
    asked = [m for m in r.json()["items"] if m.get("tool_calls")] if r.status_code == 200 else []
    return asked[-1]["tool_calls"][0]["id"] if asked else "call_0_0"


Send = Callable[[Any, dict[str, Any]], httpx.Response]

COMMANDS: dict[str, Send] = {
    "retry": lambda c, t: c.post(f"/v1/turns/{t['id']}/retry", json={}),
    "retry (no body)": lambda c, t: c.post(f"/v1/turns/{t['id']}/retry"),
    "resume RETRY": lambda c, t: c.post(f"/v1/turns/{t['id']}/resume", json={"command": "RETRY"}),
    "retry force": lambda c, t: c.post(f"/v1/turns/{t['id']}/retry", json={"force": True}),
    "resume CONTINUE": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/resume", json={"command": "CONTINUE"}
    ),
    "retry-model": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/retry-model", json={"failure_id": _failure_id(t)}
    ),
    "resume RETRY_MODEL": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/resume", json={"command": "RETRY_MODEL", "failure_id": _failure_id(t)}
    ),
    "messages": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/messages", json={"content": "hello again"}
    ),
    "resume USER_MESSAGE": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/resume", json={"command": "USER_MESSAGE", "content": "again"}
    ),
    "tool-results": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/tool-results",
        json={"tool_call_id": _call_id(c, t), "content": {"answer": 1}},
    ),
    "tool-results error": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/tool-results",
        json={"tool_call_id": _call_id(c, t), "error": {"code": "nope", "message": "x"}},
    ),
    "resume TOOL_RESULT": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/resume",
        json={"command": "TOOL_RESULT", "tool_call_id": _call_id(c, t), "content": "r"},
    ),
    "resume TOOL_ERROR": lambda c, t: c.post(
        f"/v1/turns/{t['id']}/resume",
        json={"command": "TOOL_ERROR", "tool_call_id": _call_id(c, t), "error": {"code": "nope"}},
    ),
    "cancel": lambda c, t: c.post(f"/v1/turns/{t['id']}/cancel", json={}),
}

# The statuses each command fits; anywhere else it must be refused.
FITS: dict[str, set[str]] = {
    "retry": {"RETRY_SCHEDULED"},  # ... when due; the zoo's one is not: not_due
    "retry (no body)": {"RETRY_SCHEDULED"},
    "resume RETRY": {"RETRY_SCHEDULED"},
    "retry force": {"RETRY_SCHEDULED"},
    "resume CONTINUE": {"RETRY_SCHEDULED"},
    "retry-model": {"WAITING_FOR_MODEL"},
    "resume RETRY_MODEL": {"WAITING_FOR_MODEL"},
    "messages": set(LIVE_ZOO),
    "resume USER_MESSAGE": set(LIVE_ZOO),
    "tool-results": {"WAITING_FOR_TOOL"},
    "tool-results error": {"WAITING_FOR_TOOL"},
    "resume TOOL_RESULT": {"WAITING_FOR_TOOL"},
    "resume TOOL_ERROR": {"WAITING_FOR_TOOL"},
    "cancel": {*LIVE_ZOO, "CANCELLED"},
}


NOT_DUE = {"retry", "retry (no body)", "resume RETRY"}


def expected_refusal(command: str, status: str) -> str | None:
    """The 409 code `command` must answer in `status`, or None where it is accepted."""
    if command in NOT_DUE and status == "RETRY_SCHEDULED":
        return "not_due"  # the zoo's retry is a minute away
    if status in FITS[command]:
        return None
    return "turn_finished" if status in TERMINAL_ZOO else "invalid_state"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_in_a_status_it_does_not_fit_changes_nothing(
    zoo: tuple[Any, dict[str, dict[str, Any]]], command: str
) -> None:
    c, turns = zoo
    checked = 0
    for status, turn in turns.items():
        code = expected_refusal(command, status)
        if code is None:
            continue
        before = snapshot(c, turn["id"])
        assert before[0]["status"] == status
        answer = problem(COMMANDS[command](c, before[0]), code)
        if code in ("invalid_state", "turn_finished"):
            assert answer["turn_status"] == status, (command, status, answer)
        if code == "not_due":
            assert when(answer["next_runnable_at"]) == when(before[0]["next_runnable_at"])
            assert when(answer["next_runnable_at"]) > datetime.now(UTC)  # type: ignore[operator]
        assert answer["detail"]
        assert snapshot(c, turn["id"]) == before, (command, status)
        checked += 1
    assert checked >= 3  # cancel fits every live status and CANCELLED


def test_stale_failure_and_unknown_tool_call_change_nothing(
    zoo: tuple[Any, dict[str, dict[str, Any]]],
) -> None:
    c, turns = zoo
    waiting = turns["WAITING_FOR_MODEL"]
    before = snapshot(c, waiting["id"])
    for send in (
        lambda: c.post(
            f"/v1/turns/{waiting['id']}/retry-model", json={"failure_id": "fail_someone_else"}
        ),
        lambda: c.post(
            f"/v1/turns/{waiting['id']}/resume",
            json={"command": "RETRY_MODEL", "failure_id": "fail_someone_else"},
        ),
    ):
        answer = problem(send(), "stale_failure")
        assert answer["failure_id"] == waiting["last_error"]["failure_id"]
        assert snapshot(c, waiting["id"]) == before

    tool = turns["WAITING_FOR_TOOL"]
    before = snapshot(c, tool["id"])
    for body in (
        {"tool_call_id": "call_not_pending", "content": "x"},
        {"tool_call_id": "call_not_pending", "error": {"code": "e"}},
    ):
        answer = problem(c.post(f"/v1/turns/{tool['id']}/tool-results", json=body), "invalid_state")
        assert answer["turn_status"] == "WAITING_FOR_TOOL"
    answer = problem(
        c.post(
            f"/v1/turns/{tool['id']}/resume",
            json={"command": "TOOL_RESULT", "tool_call_id": "call_not_pending", "content": "x"},
        ),
        "invalid_state",
    )
    assert snapshot(c, tool["id"]) == before


def test_cancelling_a_cancelled_turn_answers_it_again(
    zoo: tuple[Any, dict[str, dict[str, Any]]],
) -> None:
    c, turns = zoo
    turn = turns["CANCELLED"]
    before = snapshot(c, turn["id"])
    again = accepted(c.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "again"}))
    assert again == before[0]
    assert snapshot(c, turn["id"]) == before


def test_commands_on_an_unknown_turn_are_404(api_only: Any) -> None:
    for name, send in COMMANDS.items():
        r = send(api_only, {"id": "turn_nope", "last_error": None})
        assert r.status_code == 404, (name, r.text)
        problem(r, "not_found", 404)


def test_malformed_commands_are_422_and_change_nothing(client: Any) -> None:
    make_agents(client)
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    call = turn["pending_tool_calls"][0]["id"]
    before = snapshot(client, turn["id"])
    url = f"/v1/turns/{turn['id']}"
    bad: list[tuple[str, Any, str]] = [
        ("/resume", {"command": "RESTART"}, "body.command"),
        ("/resume", {}, "body.command"),
        ("/resume", {"command": "RETRY_MODEL"}, "body.failure_id"),
        ("/resume", {"command": "USER_MESSAGE"}, "body.content"),
        ("/resume", {"command": "USER_MESSAGE", "content": 5}, "body.content"),
        ("/resume", {"command": "TOOL_RESULT", "content": "x"}, "body.tool_call_id"),
        ("/resume", {"command": "TOOL_RESULT", "tool_call_id": call}, "body.content"),
        ("/resume", {"command": "TOOL_ERROR", "tool_call_id": call}, "body.error"),
        ("/resume", {"command": "RETRY", "bogus": 1}, "body.bogus"),
        ("/tool-results", {"tool_call_id": call}, "body"),
        ("/tool-results", {"tool_call_id": call, "content": "x", "error": {"code": "e"}}, "body"),
        (
            "/tool-results",
            {"tool_call_id": call, "error": {"message": "no code"}},
            "body.error.code",
        ),
        ("/tool-results", {"content": "x"}, "body.tool_call_id"),
        ("/retry-model", {}, "body.failure_id"),
        (
            "/retry-model",
            {"failure_id": "f", "model": {"provider": "nope", "model": "m"}},
            "body.model.provider",
        ),
        ("/messages", {}, "body.content"),
        ("/messages", {"content": ["a"]}, "body.content"),
        ("/messages", {"content": "x", "message_id": ""}, "body.message_id"),
        ("/retry", {"force": "yes please"}, "body.force"),
        ("/cancel", {"reason": 12}, "body.reason"),
    ]
    for path, body, field in bad:
        answer = problem(client.post(url + path, json=body), "validation_error", 422)
        assert field in [e["field"] for e in answer["errors"]], (path, body, answer)
    assert snapshot(client, turn["id"]) == before


# ---- RETRY and CONTINUE --------------------------------------------------------------------


@pytest.mark.parametrize("form", ["retry", "resume"])
def test_retry_when_due_resumes_and_keeps_the_consecutive_count(db_url: str, form: str) -> None:
    soon = {"retry": {"max_retries": 1, "initial_delay_ms": 1, "max_delay_ms": 1}}
    with api_client(db_url, scheduler_enabled=False) as c:
        make_agents(c)
        create_agent(c, "soon", scripted(OVERLOADED, {"content": "recovered"}), policy=soon)
        turn = park(c, "soon", "RETRY_SCHEDULED")
        not_due = park(c, "later", "RETRY_SCHEDULED")
        assert turn["retry_count"] == 1
        assert turn["consecutive_retry_count"] == 1
        assert turn["next_runnable_at"] is not None
        assert turn["last_error"]["error_class"] == "overloaded"

        deadline = time.monotonic() + 10
        due: list[str] = []
        while turn["id"] not in due and time.monotonic() < deadline:
            r = c.get("/v1/admin/turns/due")
            assert r.status_code == 200, r.text
            due = [t["id"] for t in r.json()["items"]]
            time.sleep(0.02)
        assert turn["id"] in due
        assert not_due["id"] not in due
        # the scheduler is off: nobody but the API resumes it
        assert c.get(f"/v1/turns/{turn['id']}").json()["status"] == "RETRY_SCHEDULED"

        send = (
            (lambda: c.post(f"/v1/turns/{turn['id']}/retry", json={}))
            if form == "retry"
            else (lambda: c.post(f"/v1/turns/{turn['id']}/resume", json={"command": "RETRY"}))
        )
        resumed = accepted(send())
        assert resumed["status"] == "RUNNING"
        assert resumed["next_runnable_at"] is None
        assert resumed["consecutive_retry_count"] == 1  # RETRY does not reset it
        assert resumed["retry_count"] == 1
        assert resumed["version"] > turn["version"]

        done = wait_status(c, turn["id"], "COMPLETED")
        assert done["output"] == "recovered"
        assert done["retry_count"] == 1
        assert done["consecutive_retry_count"] == 0  # a successful model call resets it
        assert "RETRY" in command_events(c, turn["id"])
        assert turn["id"] not in [t["id"] for t in c.get("/v1/admin/turns/due").json()["items"]]
        # once resumed, another RETRY does not fit
        problem(send(), "turn_finished")


@pytest.mark.parametrize("form", ["retry", "resume"])
def test_force_retry_resumes_at_once(client: Any, form: str) -> None:
    make_agents(client)
    turn = park(client, "later", "RETRY_SCHEDULED")
    assert when(turn["next_runnable_at"]) is not None
    if form == "retry":
        r = client.post(f"/v1/turns/{turn['id']}/retry", json={"force": True})
    else:
        r = client.post(f"/v1/turns/{turn['id']}/resume", json={"command": "CONTINUE"})
    resumed = accepted(r)
    assert resumed["status"] == "RUNNING"
    assert resumed["next_runnable_at"] is None
    assert resumed["consecutive_retry_count"] == 1  # CONTINUE keeps it (RUNNER.md, Counters)
    assert resumed["retry_count"] == 1
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "recovered"
    assert done["retry_count"] == 1
    assert "CONTINUE" in command_events(client, turn["id"])


# ---- RETRY_MODEL ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["retry-model", "resume"])
def test_retry_model_with_the_last_failure_continues(client: Any, form: str) -> None:
    make_agents(client)
    turn = park(client, "flaky", "WAITING_FOR_MODEL")
    failure = turn["last_error"]
    assert failure["error_class"] == "overloaded"
    assert failure["source"] == "model"
    assert turn["next_runnable_at"] is None
    if form == "retry-model":
        r = client.post(
            f"/v1/turns/{turn['id']}/retry-model", json={"failure_id": failure["failure_id"]}
        )
    else:
        r = client.post(
            f"/v1/turns/{turn['id']}/resume",
            json={"command": "RETRY_MODEL", "failure_id": failure["failure_id"]},
        )
    assert accepted(r)["status"] == "RUNNING"
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "recovered"
    assert "RETRY_MODEL" in command_events(client, turn["id"])


def test_retry_model_can_switch_the_model_for_the_rest_of_the_turn(client: Any) -> None:
    create_agent(client, "stuck", scripted(OVERLOADED), tools=[CALCULATOR], policy=PARK_MODEL)
    turn = park(client, "stuck", "WAITING_FOR_MODEL")
    # the n-th model call of a turn gets the n-th reply: calls 2 and 3 take replies 2 and 3
    backup = scripted(
        {"content": "never used"},
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}]},
        {"content": "42 from backup"},
        model="backup",
    )
    r = client.post(
        f"/v1/turns/{turn['id']}/resume",
        json={
            "command": "RETRY_MODEL",
            "failure_id": turn["last_error"]["failure_id"],
            "model": backup,
        },
    )
    assert accepted(r)["status"] == "RUNNING"
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "42 from backup"
    attempts = [e["data"] for e in events(client, turn["id"]) if e["type"] == "model_attempt"]
    assert [(a["model"], a["outcome"]) for a in attempts] == [
        ("script", "error"),
        ("backup", "ok"),
        ("backup", "ok"),
    ]
    # the agent itself is unchanged
    agent = client.get("/v1/agents/stuck").json()
    assert agent["version"] == 1
    assert agent["model"]["model"] == "script"


# ---- USER_MESSAGE ------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["WAITING_FOR_MODEL", "RETRY_SCHEDULED"])
def test_user_message_resumes_a_waiting_turn(client: Any, status: str) -> None:
    make_agents(client)
    turn = park(client, "flaky" if status == "WAITING_FOR_MODEL" else "later", status)
    r = client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "please try again"})
    resumed = accepted(r)
    assert resumed["status"] == "RUNNING"
    assert resumed["next_runnable_at"] is None
    assert resumed["consecutive_retry_count"] == 0
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "recovered"
    assert done["retry_count"] == turn["retry_count"]
    roles = [(m["role"], m["content"]) for m in messages(client, turn["id"])]
    assert roles == [("user", "hi"), ("user", "please try again"), ("assistant", "recovered")]
    assert "USER_MESSAGE" in command_events(client, turn["id"])


def test_user_message_closes_pending_tool_calls_then_continues(client: Any) -> None:
    make_agents(client)
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    pending = [c["id"] for c in turn["pending_tool_calls"]]
    assert len(pending) == 2
    r = client.post(
        f"/v1/turns/{turn['id']}/resume", json={"command": "USER_MESSAGE", "content": "never mind"}
    )
    resumed = accepted(r)
    assert resumed["status"] == "RUNNING"
    assert resumed["pending_tool_calls"] == []
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "done"
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert [m["tool_call_id"] for m in msgs[2:4]] == pending
    assert all("did not complete" in m["content"] for m in msgs[2:4])
    assert msgs[4]["content"] == "never mind"
    assert msgs[5]["content"] == "done"


def test_user_message_is_queued_in_ready_and_taken_once(db_url: str, api_only: Any) -> None:
    make_agents(api_only)
    turn = create_turn(api_only, "quick", "first")
    first = accepted(
        api_only.post(
            f"/v1/turns/{turn['id']}/messages",
            json={"content": "and also this", "message_id": "m-1"},
        )
    )
    assert first["status"] == "READY"
    assert first["version"] > turn["version"]
    repeat = accepted(
        api_only.post(
            f"/v1/turns/{turn['id']}/resume",
            json={"command": "USER_MESSAGE", "content": "and also this", "message_id": "m-1"},
        )
    )
    assert repeat["version"] == first["version"]
    assert command_events(api_only, turn["id"]) == ["USER_MESSAGE"]
    # queued: not in the transcript before a worker delivers it
    assert [m["content"] for m in messages(api_only, turn["id"])] == ["first"]
    with api_client(db_url) as worker:
        done = wait_status(worker, turn["id"], "COMPLETED")
        assert done["output"] == "hi"
        roles = [(m["role"], m["content"]) for m in messages(worker, turn["id"])]
        assert roles == [("user", "first"), ("user", "and also this"), ("assistant", "hi")]
        problem(
            worker.post(
                f"/v1/turns/{turn['id']}/messages", json={"content": "late", "message_id": "m-2"}
            ),
            "turn_finished",
        )


def test_repeated_message_id_in_a_waiting_turn_is_taken_once(client: Any) -> None:
    make_agents(client)
    create_agent(client, "stuck", scripted(OVERLOADED), policy=PARK_MODEL)
    turn = park(client, "stuck", "WAITING_FOR_MODEL")
    accepted(
        client.post(
            f"/v1/turns/{turn['id']}/messages", json={"content": "ping", "message_id": "same"}
        )
    )
    # the answer said RUNNING: it ran again, failed again and parked again
    parked = wait_status(client, turn["id"], "WAITING_FOR_MODEL")
    assert len([e for e in events(client, turn["id"]) if e["type"] == "model_attempt"]) == 2
    before = snapshot(client, parked["id"])
    again = accepted(
        client.post(
            f"/v1/turns/{turn['id']}/messages", json={"content": "ping", "message_id": "same"}
        )
    )
    assert again["version"] == before[0]["version"]
    assert snapshot(client, parked["id"]) == before
    assert [m["content"] for m in messages(client, turn["id"]) if m["role"] == "user"] == [
        "hi",
        "ping",
    ]


class _Gate:
    """An `http` tool that answers only when the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                gate.entered.set()
                gate.open.wait(30)
                body = json.dumps({"gate": "passed"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/gate"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.open.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gate() -> Iterator[_Gate]:
    g = _Gate()
    yield g
    g.close()


def test_user_message_in_running_is_queued_before_the_next_model_call(
    client: Any, gate: _Gate
) -> None:
    tool = {"name": "gate", "description": "Waits.", "kind": "http", "url": gate.url}
    create_agent(
        client,
        "gated",
        scripted(
            {"tool_calls": [{"name": "gate", "arguments": {}}]}, {"content": "after the gate"}
        ),
        tools=[tool],
    )
    turn = create_turn(client, "gated", "go")
    assert gate.entered.wait(20)
    running = client.get(f"/v1/turns/{turn['id']}").json()
    assert running["status"] == "RUNNING"
    queued = accepted(
        client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "one more thing"})
    )
    assert queued["status"] == "RUNNING"
    assert [m["role"] for m in messages(client, turn["id"])] == ["user", "assistant"]
    gate.open.set()
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "after the gate"
    roles = [(m["role"], m["content"]) for m in messages(client, turn["id"])]
    assert roles[0] == ("user", "go")
    assert roles[1][0] == "assistant"
    assert roles[2][0] == "tool"
    assert roles[3:] == [("user", "one more thing"), ("assistant", "after the gate")]


# ---- TOOL_RESULT / TOOL_ERROR ---------------------------------------------------------------


@pytest.mark.parametrize("form", ["tool-results", "resume"])
def test_tool_results_then_the_turn_runs_on(client: Any, form: str) -> None:
    # An external tool's error goes to the model under RETURN_ERROR_TO_MODEL (under FAIL_RUN,
    # the default, it fails the turn: test_api_review_fixes).
    create_agent(
        client,
        "asks",
        scripted(ASK_TWO, {"content": "done"}),
        tools=[EXTERNAL],
        policy={"tool_error_strategy": "RETURN_ERROR_TO_MODEL"},
    )
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    first, second = (c["id"] for c in turn["pending_tool_calls"])
    assert [c["arguments"] for c in turn["pending_tool_calls"]] == [{"q": "a"}, {"q": "b"}]
    assert [c["name"] for c in turn["pending_tool_calls"]] == ["lookup", "lookup"]

    def send(body: dict[str, Any], command: str) -> httpx.Response:
        if form == "tool-results":
            return client.post(f"/v1/turns/{turn['id']}/tool-results", json=body)
        return client.post(f"/v1/turns/{turn['id']}/resume", json={"command": command, **body})

    half = accepted(send({"tool_call_id": first, "content": {"answer": 42}}, "TOOL_RESULT"))
    assert half["status"] == "WAITING_FOR_TOOL"
    assert [c["id"] for c in half["pending_tool_calls"]] == [second]

    before = snapshot(client, turn["id"])
    problem(send({"tool_call_id": first, "content": "again"}, "TOOL_RESULT"), "invalid_state")
    assert snapshot(client, turn["id"]) == before

    resumed = accepted(
        send(
            {"tool_call_id": second, "error": {"code": "not_found", "message": "no such record"}},
            "TOOL_ERROR",
        )
    )
    assert resumed["status"] == "RUNNING"
    assert resumed["pending_tool_calls"] == []
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "done"
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert msgs[2]["tool_call_id"] == first
    assert json.loads(msgs[2]["content"]) == {"answer": 42}
    assert msgs[3]["tool_call_id"] == second
    assert json.loads(msgs[3]["content"]) == {"code": "not_found", "message": "no such record"}
    assert command_events(client, turn["id"]) == ["TOOL_RESULT", "TOOL_ERROR"]


def test_text_tool_result_is_kept_as_written(client: Any) -> None:
    create_agent(
        client,
        "one",
        scripted({"tool_calls": [{"name": "lookup", "arguments": {}}]}, {"content": "ok"}),
        tools=[EXTERNAL],
    )
    turn = park(client, "one", "WAITING_FOR_TOOL")
    call = turn["pending_tool_calls"][0]["id"]
    accepted(
        client.post(
            f"/v1/turns/{turn['id']}/tool-results",
            json={"tool_call_id": call, "content": "plain text, not JSON"},
        )
    )
    wait_status(client, turn["id"], "COMPLETED")
    tool_msgs = [m for m in messages(client, turn["id"]) if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["plain text, not JSON"]


def _at_once(n: int, call: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """`call()` from n threads released together."""
    barrier = threading.Barrier(n)

    def run(_: int) -> httpx.Response:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_concurrent_results_for_one_call_are_taken_once(client: Any) -> None:
    make_agents(client)
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    first = turn["pending_tool_calls"][0]["id"]
    answers = _at_once(
        8,
        lambda: client.post(
            f"/v1/turns/{turn['id']}/tool-results", json={"tool_call_id": first, "content": "r"}
        ),
    )
    assert sorted(r.status_code for r in answers) == [202] + [409] * 7, [r.text for r in answers]
    assert {r.json()["code"] for r in answers if r.status_code == 409} == {"invalid_state"}
    tool_msgs = [m for m in messages(client, turn["id"]) if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [first]
    now = client.get(f"/v1/turns/{turn['id']}").json()
    assert now["status"] == "WAITING_FOR_TOOL"
    assert len(now["pending_tool_calls"]) == 1


def test_concurrent_messages_with_one_id_are_taken_once(api_only: Any) -> None:
    make_agents(api_only)
    turn = create_turn(api_only, "quick")
    answers = _at_once(
        8,
        lambda: api_only.post(
            f"/v1/turns/{turn['id']}/messages", json={"content": "once", "message_id": "m"}
        ),
    )
    assert [r.status_code for r in answers] == [202] * 8, [r.text for r in answers]
    assert command_events(api_only, turn["id"]) == ["USER_MESSAGE"]
    assert api_only.get(f"/v1/turns/{turn['id']}").json()["version"] == turn["version"] + 1


def test_concurrent_cancels_close_the_transcript_once(client: Any) -> None:
    make_agents(client)
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    answers = _at_once(8, lambda: client.post(f"/v1/turns/{turn['id']}/cancel", json={}))
    assert [r.status_code for r in answers] == [202] * 8, [r.text for r in answers]
    assert {r.json()["status"] for r in answers} == {"CANCELLED"}
    roles = [m["role"] for m in messages(client, turn["id"])]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    assert command_events(client, turn["id"]) == ["CANCEL"]


# ---- CANCEL --------------------------------------------------------------------------------


def test_cancel_of_a_turn_waiting_for_tools_closes_the_transcript_once(client: Any) -> None:
    make_agents(client)
    turn = park(client, "asks", "WAITING_FOR_TOOL")
    pending = [c["id"] for c in turn["pending_tool_calls"]]
    done = accepted(client.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "user left"}))
    assert done["status"] == "CANCELLED"
    assert done["finished_at"] is not None
    assert done["pending_tool_calls"] == []
    assert done["cancel_requested"] is True
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m["tool_call_id"] for m in msgs[2:4]] == pending
    assert msgs[2]["content"] == "Tool lookup did not complete: user left"
    assert msgs[4]["content"] == "This turn ended before completion: user left"
    before = snapshot(client, turn["id"])
    assert accepted(client.post(f"/v1/turns/{turn['id']}/cancel")) == before[0]
    assert snapshot(client, turn["id"]) == before
    assert command_events(client, turn["id"]) == ["CANCEL"]


def test_cancel_of_a_ready_turn_uses_the_policy_reason(api_only: Any) -> None:
    create_agent(
        api_only,
        "polite",
        scripted({"content": "x"}),
        policy={"cancellation_reason": "stopped by the operator"},
    )
    turn = create_turn(api_only, "polite")
    done = accepted(api_only.post(f"/v1/turns/{turn['id']}/cancel"))
    assert done["status"] == "CANCELLED"
    assert done["status_reason"] == "stopped by the operator"
    msgs = messages(api_only, turn["id"])
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("user", "hi"),
        ("assistant", "This turn ended before completion: stopped by the operator"),
    ]


def test_cancel_of_a_scheduled_retry_resets_the_consecutive_count(client: Any) -> None:
    make_agents(client)
    turn = park(client, "later", "RETRY_SCHEDULED")
    assert turn["consecutive_retry_count"] == 1
    done = accepted(client.post(f"/v1/turns/{turn['id']}/cancel", json={}))
    assert done["status"] == "CANCELLED"
    assert done["next_runnable_at"] is None
    assert done["consecutive_retry_count"] == 0
    assert done["retry_count"] == 1


def test_cancel_of_a_running_turn_is_finished_by_its_worker(client: Any) -> None:
    turn = running_held(client)
    flagged = accepted(client.post(f"/v1/turns/{turn['id']}/cancel", json={"reason": "stop"}))
    assert flagged["cancel_requested"] is True
    assert flagged["status"] in ("RUNNING", "CANCELLED")
    done = wait_status(client, turn["id"], "CANCELLED")
    assert done["status_reason"] == "stop"
    msgs = messages(client, turn["id"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[-1]["content"] == "This turn ended before completion: stop"


def test_cancel_of_a_finished_turn_is_turn_finished(client: Any) -> None:
    make_agents(client)
    turn = park(client, "quick", "COMPLETED")
    before = snapshot(client, turn["id"])
    answer = problem(client.post(f"/v1/turns/{turn['id']}/cancel", json={}), "turn_finished")
    assert answer["turn_status"] == "COMPLETED"
    assert snapshot(client, turn["id"]) == before


# ---- consecutive_retry_count ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["retry-model", "messages"])
def test_commands_reset_the_consecutive_count_but_never_retry_count(
    client: Any, command: str
) -> None:
    make_agents(client)
    turn = park(client, "twice", "WAITING_FOR_MODEL")
    # one retry scheduled and taken by the scheduler, then the retries were exhausted
    assert turn["retry_count"] == 1
    assert turn["consecutive_retry_count"] == 1
    if command == "retry-model":
        r = client.post(
            f"/v1/turns/{turn['id']}/retry-model",
            json={"failure_id": turn["last_error"]["failure_id"]},
        )
    else:
        r = client.post(f"/v1/turns/{turn['id']}/messages", json={"content": "go on"})
    resumed = accepted(r)
    assert resumed["consecutive_retry_count"] == 0
    assert resumed["retry_count"] == 1
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "recovered"
    assert done["retry_count"] == 1
    scheduled = [e for e in events(client, turn["id"]) if e["type"] == "retry_scheduled"]
    assert len(scheduled) == 1
