"""Turns over HTTP on both databases: create, policy, pinning, idempotency, conversations,
reading, listing, transcript and event log (API.md, Turns)."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tests.conftest import api_client
from tests.helpers import (
    CALCULATOR,
    TERMINAL,
    create_agent,
    create_turn,
    events,
    messages,
    scripted,
    wait_status,
)

TURN_KEYS = {
    "id",
    "agent",
    "conversation_id",
    "status",
    "status_reason",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "retry_count",
    "consecutive_retry_count",
    "next_runnable_at",
    "counters",
    "execution_policy",
    "last_error",
    "pending_tool_calls",
    "output",
    "cancel_requested",
    "metadata",
    "version",
}
COUNTER_KEYS = {
    "iterations",
    "steps",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "total_tokens",
}


def _problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    return body


def _all_turns(c: Any, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/turns", params={"limit": 200, **params})
    assert r.status_code == 200, r.text
    return r.json()["items"]  # type: ignore[no-any-return]


# ---- create ------------------------------------------------------------------------------


def test_create_is_201_ready_with_the_full_turn(api_only: Any) -> None:
    create_agent(api_only, "greeter", scripted({"content": "hi"}), system_prompt="be kind")
    r = api_only.post(
        "/v1/turns", json={"agent": "greeter", "input": "hello", "metadata": {"ticket": "T-1"}}
    )
    assert r.status_code == 201, r.text
    turn = r.json()
    assert set(turn) == TURN_KEYS
    assert turn["id"]
    assert turn["agent"] == {"name": "greeter", "version": 1}
    assert turn["status"] == "READY"
    assert turn["conversation_id"]
    assert turn["created_at"] and turn["updated_at"]
    assert turn["started_at"] is None and turn["finished_at"] is None
    assert turn["retry_count"] == 0 and turn["consecutive_retry_count"] == 0
    assert turn["next_runnable_at"] is None
    assert set(turn["counters"]) == COUNTER_KEYS
    assert all(v == 0 for v in turn["counters"].values())
    assert turn["last_error"] is None
    assert turn["pending_tool_calls"] == []
    assert turn["output"] is None
    assert turn["cancel_requested"] is False
    assert turn["metadata"] == {"ticket": "T-1"}
    assert isinstance(turn["version"], int)
    # no policy anywhere: the server's default, resolved and stored in full
    assert turn["execution_policy"]["max_iterations"] == 100
    assert turn["execution_policy"]["retry"]["max_retries"] == 0
    assert turn["execution_policy"]["tool_error_strategy"] == "FAIL_RUN"

    again = api_only.get(f"/v1/turns/{turn['id']}")
    assert again.status_code == 200
    assert again.json() == turn
    roles = [(m["role"], m["content"]) for m in messages(api_only, turn["id"])]
    assert roles == [("system", "be kind"), ("user", "hello")]


def test_turn_policy_replaces_the_agents_whole(api_only: Any) -> None:
    create_agent(
        api_only,
        "careful",
        scripted({"content": "x"}),
        policy={"max_iterations": 7, "retry": {"max_retries": 3, "jitter": 0.5}},
    )
    from_agent = create_turn(api_only, "careful")
    assert from_agent["execution_policy"]["max_iterations"] == 7
    assert from_agent["execution_policy"]["retry"]["max_retries"] == 3
    assert from_agent["execution_policy"]["retry"]["jitter"] == 0.5

    own = create_turn(api_only, "careful", execution_policy={"max_iterations": 5})
    policy = own["execution_policy"]
    assert policy["max_iterations"] == 5
    # no field merge: retry comes from the defaults, not from the agent
    assert policy["retry"]["max_retries"] == 0
    assert policy["retry"]["jitter"] == 0.0
    assert api_only.get(f"/v1/turns/{own['id']}").json()["execution_policy"] == policy


def test_invalid_turn_policy_is_422_naming_the_field(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    cases = {
        "body.execution_policy.retry.max_retries": {"retry": {"max_retries": 101}},
        "body.execution_policy.retry.multiplier": {"retry": {"multiplier": 0.5}},
        "body.execution_policy.retry.jitter": {"retry": {"jitter": 2}},
        "body.execution_policy.retry.retry_on.0": {"retry": {"retry_on": ["nope"]}},
        "body.execution_policy.interrupted_turn_message_template": {
            "interrupted_turn_message_template": "{why}"
        },
        "body.execution_policy.budget.max_tool_calls": {"budget": {"max_tool_calls": -1}},
    }
    for field, policy in cases.items():
        r = api_only.post(
            "/v1/turns", json={"agent": "a", "input": "x", "execution_policy": policy}
        )
        problem = _problem(r, 422, "validation_error")
        assert field in [e["field"] for e in problem["errors"]], (field, problem)
    assert _all_turns(api_only) == []


def test_create_with_unknown_agent_or_version_is_404(api_only: Any) -> None:
    _problem(api_only.post("/v1/turns", json={"agent": "ghost", "input": "x"}), 404, "not_found")
    create_agent(api_only, "real", scripted({"content": "x"}))
    _problem(
        api_only.post("/v1/turns", json={"agent": "real", "agent_version": 2, "input": "x"}),
        404,
        "not_found",
    )
    assert _all_turns(api_only) == []


def test_agent_version_is_pinned_at_creation(db_url: str, api_only: Any) -> None:
    create_agent(api_only, "pin", scripted({"content": "one"}))
    made_at_v1 = create_turn(api_only, "pin")
    create_agent(api_only, "pin", scripted({"content": "two"}))
    latest = create_turn(api_only, "pin")
    asked_v1 = create_turn(api_only, "pin", agent_version=1)
    assert made_at_v1["agent"] == {"name": "pin", "version": 1}
    assert latest["agent"] == {"name": "pin", "version": 2}
    assert asked_v1["agent"] == {"name": "pin", "version": 1}
    # a third version after all of them were created changes none of them
    create_agent(api_only, "pin", scripted({"content": "three"}))
    with api_client(db_url) as worker:
        outputs = {
            t["id"]: wait_status(worker, t["id"], "COMPLETED")
            for t in (made_at_v1, latest, asked_v1)
        }
    assert outputs[made_at_v1["id"]]["output"] == "one"
    assert outputs[made_at_v1["id"]]["agent"]["version"] == 1
    assert outputs[latest["id"]]["output"] == "two"
    assert outputs[asked_v1["id"]]["output"] == "one"


# ---- idempotency -------------------------------------------------------------------------


def test_idempotency_key_replays_or_conflicts(api_only: Any) -> None:
    create_agent(api_only, "idem", scripted({"content": "x"}))
    body = {"agent": "idem", "input": "do it once", "metadata": {"k": "v"}}
    first = api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "key-1"})
    assert first.status_code == 201, first.text
    replay = api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "key-1"})
    assert replay.status_code == 200, replay.text
    assert replay.json()["id"] == first.json()["id"]
    assert len(_all_turns(api_only)) == 1

    other = api_only.post(
        "/v1/turns", json={**body, "input": "something else"}, headers={"Idempotency-Key": "key-1"}
    )
    problem = _problem(other, 409, "idempotency_conflict")
    assert problem["status"] == 409
    assert len(_all_turns(api_only)) == 1

    fresh = api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "key-2"})
    assert fresh.status_code == 201
    assert fresh.json()["id"] != first.json()["id"]
    plain = api_only.post("/v1/turns", json=body)
    assert plain.status_code == 201
    assert len(_all_turns(api_only)) == 3


def test_idempotent_replay_returns_the_turn_as_it_is_now(api_only: Any) -> None:
    create_agent(api_only, "idem2", scripted({"content": "x"}))
    body = {"agent": "idem2", "input": "once"}
    first = api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "k"}).json()
    api_only.post(f"/v1/turns/{first['id']}/cancel", json={})
    replay = api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "k"})
    assert replay.status_code == 200
    assert replay.json()["id"] == first["id"]
    assert replay.json()["status"] == "CANCELLED"


def _at_once(n: int, call: Any) -> list[httpx.Response]:
    """`call()` from n threads released together."""
    barrier = threading.Barrier(n)

    def run() -> httpx.Response:
        barrier.wait()
        return call()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: run(), range(n)))


def test_concurrent_creates_with_one_key_make_one_turn(api_only: Any) -> None:
    create_agent(api_only, "idem", scripted({"content": "x"}))
    body = {"agent": "idem", "input": "race"}
    answers = _at_once(
        8, lambda: api_only.post("/v1/turns", json=body, headers={"Idempotency-Key": "raced"})
    )
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 7 + [201], [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1
    assert len(_all_turns(api_only)) == 1


# ---- conversations -----------------------------------------------------------------------


def test_concurrent_creates_in_one_conversation_make_one_turn(api_only: Any) -> None:
    create_agent(api_only, "chat", scripted({"content": "x"}))
    answers = _at_once(
        8,
        lambda: api_only.post(
            "/v1/turns", json={"agent": "chat", "input": "race", "conversation_id": "raced"}
        ),
    )
    assert sorted(r.status_code for r in answers) == [201] + [409] * 7, [r.text for r in answers]
    for r in answers:
        if r.status_code == 409:
            assert r.json()["code"] == "conversation_busy"
    assert len(_all_turns(api_only, conversation_id="raced")) == 1


def test_conversation_has_one_live_turn(api_only: Any) -> None:
    create_agent(api_only, "chat", scripted({"content": "x"}))
    first = create_turn(api_only, "chat", "one", conversation_id="conv-1")
    assert first["conversation_id"] == "conv-1"
    busy = api_only.post(
        "/v1/turns", json={"agent": "chat", "input": "two", "conversation_id": "conv-1"}
    )
    _problem(busy, 409, "conversation_busy")
    assert [t["id"] for t in _all_turns(api_only, conversation_id="conv-1")] == [first["id"]]
    # another conversation is not affected
    create_turn(api_only, "chat", "elsewhere", conversation_id="conv-2")

    cancelled = api_only.post(f"/v1/turns/{first['id']}/cancel", json={})
    assert cancelled.json()["status"] == "CANCELLED"
    second = create_turn(api_only, "chat", "two", conversation_id="conv-1")
    assert second["conversation_id"] == "conv-1"
    ids = [t["id"] for t in _all_turns(api_only, conversation_id="conv-1")]
    assert ids == [second["id"], first["id"]]


def test_conversation_turn_starts_from_history(db_url: str, fake_llm: str) -> None:
    """The model of the second turn sees the first turn's messages (counted by the fake)."""
    model = f"conv-{uuid.uuid4().hex[:12]}"
    root = fake_llm.removesuffix("/v1")
    conv = f"c-{uuid.uuid4().hex[:8]}"
    with api_client(db_url) as c:
        create_agent(
            c,
            "talker",
            {"provider": "openai", "model": model, "base_url": fake_llm},
            system_prompt="you echo",
        )
        t1 = create_turn(c, "talker", "first question", conversation_id=conv)
        done1 = wait_status(c, t1["id"], TERMINAL)
        assert done1["status"] == "COMPLETED", done1
        assert done1["output"] == "echo: first question"
        before = messages(c, t1["id"])

        t2 = create_turn(c, "talker", "second question", conversation_id=conv)
        done2 = wait_status(c, t2["id"], TERMINAL)
        assert done2["status"] == "COMPLETED", done2
        assert done2["output"] == "echo: second question"
        stats = httpx.get(f"{root}/_control/models/{model}").json()
        # turn 1: system + user; turn 2: system + user 1 + assistant 1 + user 2
        assert stats["message_counts"] == [2, 4]
        assert messages(c, t1["id"]) == before
        own = [(m["role"], m["content"]) for m in messages(c, t2["id"])]
        assert own == [
            ("system", "you echo"),
            ("user", "second question"),
            ("assistant", "echo: second question"),
        ]


# ---- read --------------------------------------------------------------------------------


def test_unknown_turn_is_404_everywhere(api_only: Any) -> None:
    for path in (
        "/v1/turns/turn_nope",
        "/v1/turns/turn_nope/messages",
        "/v1/turns/turn_nope/events",
        "/v1/turns/turn_nope?wait_ms=50&after_version=1",
    ):
        _problem(api_only.get(path), 404, "not_found")
    r = api_only.get("/v1/turns/turn_nope/events", headers={"Accept": "text/event-stream"})
    _problem(r, 404, "not_found")


# ---- list --------------------------------------------------------------------------------


def test_list_newest_first_with_filters(api_only: Any) -> None:
    create_agent(api_only, "ag_1", scripted({"content": "x"}))
    create_agent(api_only, "agX1", scripted({"content": "x"}))
    made = [
        create_turn(api_only, "ag_1", "a", conversation_id="x_y"),
        create_turn(api_only, "agX1", "b", conversation_id="xay"),
        create_turn(api_only, "ag_1", "c"),
        create_turn(api_only, "agX1", "d"),
        create_turn(api_only, "ag_1", "e"),
    ]
    for t in (made[1], made[2]):
        assert api_only.post(f"/v1/turns/{t['id']}/cancel", json={}).status_code == 202
    ids = [t["id"] for t in made]

    everything = _all_turns(api_only)
    assert [t["id"] for t in everything] == ids[::-1]
    created = [t["created_at"] for t in everything]
    assert created == sorted(created, reverse=True)

    assert [t["id"] for t in _all_turns(api_only, status="READY")] == [ids[4], ids[3], ids[0]]
    assert [t["id"] for t in _all_turns(api_only, status="CANCELLED")] == [ids[2], ids[1]]
    both = api_only.get("/v1/turns", params=[("status", "READY"), ("status", "CANCELLED")])
    assert [t["id"] for t in both.json()["items"]] == ids[::-1]
    assert _all_turns(api_only, status="COMPLETED") == []

    # exact matches: "_" is not a wildcard
    assert [t["id"] for t in _all_turns(api_only, agent="ag_1")] == [ids[4], ids[2], ids[0]]
    assert [t["id"] for t in _all_turns(api_only, agent="agX1")] == [ids[3], ids[1]]
    assert [t["id"] for t in _all_turns(api_only, conversation_id="x_y")] == [ids[0]]
    assert [t["id"] for t in _all_turns(api_only, agent="ag_1", status="CANCELLED")] == [ids[2]]
    assert _all_turns(api_only, agent="nobody") == []


def test_list_pages_with_cursor_without_gaps_or_duplicates(api_only: Any) -> None:
    create_agent(api_only, "pager", scripted({"content": "x"}))
    ids = [create_turn(api_only, "pager", f"n{i}")["id"] for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = api_only.get("/v1/turns", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= 3
        seen += [t["id"] for t in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert pages == 3
    assert seen == ids[::-1]

    # a page boundary that falls exactly on the end gives no further cursor
    r = api_only.get("/v1/turns", params={"limit": 7})
    assert len(r.json()["items"]) == 7
    assert r.json()["next_cursor"] is None

    # filters hold across pages
    first = api_only.get("/v1/turns", params={"limit": 2, "agent": "pager"}).json()
    rest = api_only.get(
        "/v1/turns", params={"limit": 200, "agent": "pager", "cursor": first["next_cursor"]}
    ).json()
    assert [t["id"] for t in first["items"] + rest["items"]] == ids[::-1]


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


def test_bad_list_parameters_are_422(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    create_turn(api_only, "a")
    bad: list[dict[str, Any]] = [
        {"cursor": "not-a-cursor"},
        {"cursor": "!!!"},
        {"cursor": _cursor({"a": 1})},
        {"cursor": _cursor([1, 2, 3])},
        {"cursor": _cursor(["yesterday", "turn_x"])},
        {"cursor": _cursor(["2024-01-01T00:00:00", "turn_x"])},  # no zone
        {"limit": 0},
        {"limit": 201},
        {"limit": "ten"},
        {"status": "DONE"},
    ]
    for params in bad:
        r = api_only.get("/v1/turns", params=params)
        problem = _problem(r, 422, "validation_error")
        assert problem["errors"], problem
    assert len(_all_turns(api_only)) == 1


def test_filters_with_sql_metacharacters_match_nothing(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    ids = {create_turn(api_only, "a")["id"] for _ in range(3)}
    for value in (
        "' OR 1=1 --",
        "%",
        "_",
        "a%",
        "%a%",
        "'; DROP TABLE turns; --",
        '"',
        "\\",
        "a' OR 'a'='a",
    ):
        for key in ("agent", "conversation_id"):
            r = api_only.get("/v1/turns", params={key: value})
            assert r.status_code == 200, (key, value, r.text)
            assert r.json() == {"items": [], "next_cursor": None}, (key, value)
    assert {t["id"] for t in _all_turns(api_only)} == ids
    assert api_only.get("/readyz").status_code == 200


# ---- transcript and events ---------------------------------------------------------------


def test_messages_and_events_of_a_completed_turn(client: Any) -> None:
    create_agent(
        client,
        "calc",
        scripted(
            {
                "tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}],
                "usage": {"input_tokens": 10, "output_tokens": 4},
            },
            {"content": "five", "usage": {"input_tokens": 20, "output_tokens": 2}},
        ),
        tools=[CALCULATOR],
        system_prompt="be brief",
    )
    turn = create_turn(client, "calc", "2+3?")
    done = wait_status(client, turn["id"], TERMINAL)
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "five"
    assert done["counters"]["iterations"] == 2
    assert done["counters"]["tool_calls"] == 1
    assert done["counters"]["input_tokens"] == 30
    assert done["counters"]["output_tokens"] == 6
    assert done["counters"]["total_tokens"] == 36
    assert done["started_at"] and done["finished_at"]

    msgs = messages(client, turn["id"])
    assert [m["seq"] for m in msgs] == [1, 2, 3, 4, 5]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    system, user, asked, result, answer = msgs
    assert system["content"] == "be brief"
    assert user["content"] == "2+3?"
    assert len(asked["tool_calls"]) == 1
    call = asked["tool_calls"][0]
    assert call["name"] == "calculator"
    assert call["arguments"] == {"expression": "2+3"}
    assert call["id"]
    assert result["tool_call_id"] == call["id"]
    assert result["content"] == "5"
    assert answer["content"] == "five"
    assert not answer.get("tool_calls")
    assert all(m["created_at"] for m in msgs)

    log = events(client, turn["id"])
    seqs = [e["seq"] for e in log]
    assert seqs == list(range(1, len(log) + 1))
    assert log[0]["type"] == "created"
    moves = [(e["data"]["from"], e["data"]["to"]) for e in log if e["type"] == "status_changed"]
    assert moves[0] == ("READY", "RUNNING")
    assert moves[-1] == ("RUNNING", "COMPLETED")
    attempts = [e["data"] for e in log if e["type"] == "model_attempt"]
    assert [a["outcome"] for a in attempts] == ["ok", "ok"]
    assert all(a["model"] == "script" for a in attempts)
    assert [e["data"]["tool"] for e in log if e["type"] == "tool_attempt"] == ["calculator"]

    middle = len(log) // 2
    r = client.get(f"/v1/turns/{turn['id']}/events", params={"after": seqs[middle - 1]})
    assert r.status_code == 200
    assert r.json()["items"] == log[middle:]
    r = client.get(f"/v1/turns/{turn['id']}/events", params={"after": seqs[-1]})
    assert r.json()["items"] == []
    for bad in ("-1", "x"):
        _problem(
            client.get(f"/v1/turns/{turn['id']}/events", params={"after": bad}),
            422,
            "validation_error",
        )


def test_failed_model_shows_last_error(client: Any) -> None:
    create_agent(
        client,
        "broken",
        scripted({"error": {"status": 401, "message": "bad key for http://10.1.2.3:8080/v1"}}),
    )
    turn = create_turn(client, "broken")
    parked = wait_status(client, turn["id"], {"WAITING_FOR_MODEL", *TERMINAL})
    assert parked["status"] == "WAITING_FOR_MODEL"
    err = parked["last_error"]
    assert set(err) >= {
        "failure_id",
        "source",
        "error_class",
        "http_status",
        "code",
        "message",
        "retryable",
        "retry_after_ms",
        "at",
    }
    assert err["source"] == "model"
    assert err["error_class"] == "auth"
    assert err["http_status"] == 401
    assert err["retryable"] is False
    assert "10.1.2.3" not in err["message"]
    assert parked["status_reason"]
    attempt = [e for e in events(client, turn["id"]) if e["type"] == "model_attempt"][-1]
    assert attempt["data"]["error_class"] == "auth"
    assert attempt["data"]["http_status"] == 401
    assert attempt["data"]["failure_id"] == err["failure_id"]


def test_a_tool_answer_with_a_nul_character_does_not_fail_the_turn(client: Any) -> None:
    """PostgreSQL text cannot hold NUL: the runner must store such a tool result some other
    way (SQLite keeps it as it is), not fail the turn with an internal error."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = b"nul\x00byte"
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tool = {
            "name": "odd",
            "description": "Answers a NUL.",
            "kind": "http",
            "url": f"http://127.0.0.1:{server.server_address[1]}/odd",
        }
        create_agent(
            client,
            "odd",
            scripted({"tool_calls": [{"name": "odd", "arguments": {}}]}, {"content": "ok"}),
            tools=[tool],
        )
        turn = create_turn(client, "odd")
        done = wait_status(client, turn["id"], TERMINAL)
        assert done["status"] == "COMPLETED", done["status_reason"]
        result = next(m for m in messages(client, turn["id"]) if m["role"] == "tool")["content"]
        assert result.startswith("nul") and result.endswith("byte")
    finally:
        server.shutdown()
        server.server_close()
