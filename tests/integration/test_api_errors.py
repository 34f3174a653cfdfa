"""Errors over HTTP on both databases: every 4xx/5xx is RFC 9457 problem+json with a fixed
code, and nothing internal (stack trace, SQL, host) leaks into an answer (API.md, Errors)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.conftest import make_settings
from tests.helpers import create_agent, create_turn, scripted

LEAKS = (
    "Traceback",
    'File "',
    "SELECT ",
    "INSERT ",
    "UPDATE turns",
    "sqlalchemy",
    "psycopg",
    "sqlite3",
    "127.0.0.1",
    "/work/",
    ".py",
    "db-host.internal",
)


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The answer is a problem+json document with the members API.md names, and no leak."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body: dict[str, Any] = r.json()
    assert isinstance(body.get("type"), str) and body["type"], body
    assert body.get("title") == HTTPStatus(status).phrase, body
    assert body.get("status") == status, body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    assert body.get("code") == code, body
    for leak in LEAKS:
        assert leak not in r.text, (leak, r.text)
    return body


def wait_for(c: Any, turn_id: str, status: str, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        turn: dict[str, Any] = c.get(f"/v1/turns/{turn_id}").json()
        if turn["status"] == status:
            return turn
        time.sleep(0.02)
    raise AssertionError(f"{turn_id} never reached {status}")


def test_every_fixed_409_and_404_code_is_a_problem(client: Any) -> None:
    create_agent(
        client, "flaky", scripted({"error": {"status": 503}}), policy={"retry": {"max_retries": 0}}
    )
    create_agent(
        client,
        "later",
        scripted({"error": {"status": 503}}),
        policy={"retry": {"max_retries": 1, "initial_delay_ms": 60_000}},
    )
    create_agent(client, "quick", scripted({"content": "hi"}))
    waiting = create_turn(client, "flaky", conversation_id="busy-conv")
    scheduled = create_turn(client, "later")
    done = create_turn(client, "quick")
    wait_for(client, waiting["id"], "WAITING_FOR_MODEL")
    wait_for(client, scheduled["id"], "RETRY_SCHEDULED")
    wait_for(client, done["id"], "COMPLETED")

    assert_problem(client.get("/v1/turns/turn_missing"), 404, "not_found")
    assert_problem(client.get("/v1/agents/missing"), 404, "not_found")
    body = assert_problem(
        client.post(f"/v1/turns/{waiting['id']}/retry", json={}), 409, "invalid_state"
    )
    assert body["turn_status"] == "WAITING_FOR_MODEL"
    body = assert_problem(
        client.post(f"/v1/turns/{scheduled['id']}/retry", json={}), 409, "not_due"
    )
    assert body["next_runnable_at"]
    assert_problem(
        client.post(f"/v1/turns/{waiting['id']}/retry-model", json={"failure_id": "fail_old"}),
        409,
        "stale_failure",
    )
    assert_problem(
        client.post(
            "/v1/turns", json={"agent": "quick", "input": "x", "conversation_id": "busy-conv"}
        ),
        409,
        "conversation_busy",
    )
    body = assert_problem(
        client.post(f"/v1/turns/{done['id']}/messages", json={"content": "late"}),
        409,
        "turn_finished",
    )
    assert body["turn_status"] == "COMPLETED"
    first = client.post(
        "/v1/turns", json={"agent": "quick", "input": "a"}, headers={"Idempotency-Key": "same"}
    )
    assert first.status_code == 201
    assert_problem(
        client.post(
            "/v1/turns", json={"agent": "quick", "input": "b"}, headers={"Idempotency-Key": "same"}
        ),
        409,
        "idempotency_conflict",
    )


POSTS = [
    "/v1/agents",
    "/v1/turns",
    "/v1/turns/{id}/resume",
    "/v1/turns/{id}/retry",
    "/v1/turns/{id}/retry-model",
    "/v1/turns/{id}/messages",
    "/v1/turns/{id}/tool-results",
    "/v1/turns/{id}/cancel",
]


def test_malformed_json_is_422_on_every_post(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    turn = create_turn(api_only, "a")
    for path in POSTS:
        url = path.format(id=turn["id"])
        for raw in (b"{not json", b'{"a": 1,}', b"[1, 2", b'{"content": "unterminated}'):
            r = api_only.post(url, content=raw, headers={"content-type": "application/json"})
            body = assert_problem(r, 422, "validation_error")
            assert body["errors"], body
    # the turn is as it was
    assert api_only.get(f"/v1/turns/{turn['id']}").json() == turn
    assert len(api_only.get("/v1/turns").json()["items"]) == 1


def test_bodies_of_the_wrong_shape_are_422_naming_the_field(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    cases: list[tuple[Any, str]] = [
        ({"agent": "a", "input": 5}, "body.input"),
        ({"agent": "a"}, "body.input"),
        ({"input": "x"}, "body.agent"),
        ({"agent": "", "input": "x"}, "body.agent"),
        ({"agent": "a", "input": "x", "agent_version": "latest"}, "body.agent_version"),
        ({"agent": "a", "input": "x", "agent_version": 0}, "body.agent_version"),
        ({"agent": "a", "input": "x", "agent_version": 10**20}, "body.agent_version"),
        ({"agent": "a", "input": "x", "metadata": {"k": 1}}, "body.metadata.k"),
        ({"agent": "a", "input": "x", "metadata": ["k"]}, "body.metadata"),
        ({"agent": "a", "input": "x", "conversation_id": "has space"}, "body.conversation_id"),
        ({"agent": "a", "input": "x", "conversation_id": ""}, "body.conversation_id"),
        ({"agent": "a", "input": "x", "execution_policy": "fast"}, "body.execution_policy"),
        ({"agent": "a", "input": "x", "surprise": True}, "body.surprise"),
        ([{"agent": "a", "input": "x"}], "body"),
        ("just a string", "body"),
        (None, "body"),
    ]
    for body, field in cases:
        r = api_only.post("/v1/turns", json=body)
        problem = assert_problem(r, 422, "validation_error")
        assert field in [e["field"] for e in problem["errors"]], (body, problem)
    assert api_only.get("/v1/turns").json()["items"] == []


def test_query_values_out_of_range_are_422(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    turn = create_turn(api_only, "a")
    for path, params in [
        ("/v1/agents/a", {"version": 10**20}),
        (f"/v1/turns/{turn['id']}/events", {"after": 10**20}),
        (f"/v1/turns/{turn['id']}/events", {"after": "last"}),
        (f"/v1/turns/{turn['id']}", {"wait_ms": 60_001, "after_version": 1}),
        (f"/v1/turns/{turn['id']}", {"wait_ms": -1, "after_version": 1}),
        (f"/v1/turns/{turn['id']}", {"wait_ms": 10, "after_version": "v1"}),
        ("/v1/turns", {"limit": -1}),
        ("/v1/admin/turns/due", {"limit": 0}),
    ]:
        problem = assert_problem(api_only.get(path, params=params), 422, "validation_error")
        assert problem["errors"][0]["field"].startswith("query."), problem


def test_nul_characters_are_refused_or_kept_never_a_500(api_only: Any) -> None:
    """PostgreSQL text cannot hold NUL; SQLite can. Either way the answer is not a 500."""
    create_agent(api_only, "a", scripted({"content": "x"}))
    turn = create_turn(api_only, "a")
    sends = [
        lambda: api_only.post("/v1/turns", json={"agent": "a", "input": "x\u0000y"}),
        lambda: api_only.post(
            "/v1/turns", json={"agent": "a", "input": "x", "metadata": {"k": "v\u0000"}}
        ),
        lambda: api_only.post(
            "/v1/agents",
            json={"name": "b", "description": "d\u0000", "model": scripted({"content": "x"})},
        ),
        lambda: api_only.get("/v1/turns", params={"agent": "a\u0000"}),
        lambda: api_only.post(
            f"/v1/turns/{turn['id']}/messages", json={"content": "m\u0000", "message_id": "id-1"}
        ),
    ]
    for send in sends:
        r = send()
        assert r.status_code in (200, 201, 202, 422), r.text
        if r.status_code == 422:
            assert_problem(r, 422, "validation_error")
    assert api_only.get(f"/v1/turns/{turn['id']}").status_code == 200


def test_unknown_routes_and_methods_are_problems(api_only: Any) -> None:
    assert_problem(api_only.get("/v1/nothing-here"), 404, "not_found")
    assert_problem(api_only.get("/"), 404, "not_found")
    assert_problem(api_only.post("/v1/turns/x/explode", json={}), 404, "not_found")
    r = api_only.delete("/v1/agents")
    assert r.status_code == 405
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["status"] == 405
    assert "POST" in r.headers["allow"]  # (Starlette names the first matching route's only)
    r = api_only.put("/v1/turns", json={})
    assert r.status_code == 405
    assert r.headers["content-type"].startswith("application/problem+json")


@pytest.fixture
def fragile(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The app with a store function that blows up with internal detail in its message."""
    from app.store import agents as agents_store

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError(
            "SELECT secret FROM agents -- db-host.internal:5432\n"
            'Traceback (most recent call last):\n  File "/work/app.py"'
        )

    monkeypatch.setattr(agents_store, "list_latest", boom)
    app = create_app(make_settings(db_url), run_worker=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_an_unexpected_error_is_a_bare_500_problem(fragile: TestClient) -> None:
    r = fragile.get("/v1/agents")
    body = assert_problem(r, 500, "internal")
    assert "secret" not in r.text
    assert set(body) == {"type", "title", "status", "detail", "code"}
    # the service goes on answering
    assert fragile.get("/healthz").status_code == 200
    assert fragile.get("/v1/turns").status_code == 200


def test_validation_problems_list_every_error(api_only: Any) -> None:
    r = api_only.post("/v1/agents", json={"name": "", "model": {"provider": "x"}, "tools": 3})
    body = assert_problem(r, 422, "validation_error")
    fields = {e["field"] for e in body["errors"]}
    assert {"body.name", "body.tools"} <= fields
    assert any(f.startswith("body.model") for f in fields)
    assert all(isinstance(e["message"], str) and e["message"] for e in body["errors"])
    assert body["detail"].startswith(body["errors"][0]["field"])
