"""Bearer-token roles and the request size limit over HTTP on both databases (API.md, Auth)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, make_url, text

from tests.conftest import api_client
from tests.helpers import create_agent, create_turn, scripted

CLIENT = {"Authorization": "Bearer c1"}
ADMIN = {"Authorization": "Bearer a1"}
LATER = {"retry": {"max_retries": 1, "initial_delay_ms": 60_000}}


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    assert body["status"] == status
    for secret in ("c1", "a1"):
        assert f"Bearer {secret}" not in r.text
    return body


@pytest.fixture
def secured(db_url: str) -> Iterator[Any]:
    with api_client(db_url, api_tokens="c1", admin_tokens="a1") as c:
        yield c


def wait_status(c: Any, turn_id: str, status: str, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        turn: dict[str, Any] = c.get(f"/v1/turns/{turn_id}", headers=ADMIN).json()
        if turn["status"] == status:
            return turn
        time.sleep(0.02)
    raise AssertionError(f"{turn_id} never reached {status}")


def _routes(turn_id: str) -> list[tuple[str, str, Any]]:
    return [
        ("GET", "/v1/agents", None),
        ("GET", "/v1/agents/quick", None),
        ("POST", "/v1/agents", {"name": "x", "model": scripted({"content": "x"})}),
        ("GET", "/v1/turns", None),
        ("POST", "/v1/turns", {"agent": "quick", "input": "x"}),
        ("GET", f"/v1/turns/{turn_id}", None),
        ("GET", f"/v1/turns/{turn_id}?wait_ms=10&after_version=100", None),
        ("GET", f"/v1/turns/{turn_id}/messages", None),
        ("GET", f"/v1/turns/{turn_id}/events", None),
        ("POST", f"/v1/turns/{turn_id}/resume", {"command": "RETRY"}),
        ("POST", f"/v1/turns/{turn_id}/retry", {}),
        ("POST", f"/v1/turns/{turn_id}/retry-model", {"failure_id": "f"}),
        ("POST", f"/v1/turns/{turn_id}/messages", {"content": "x"}),
        ("POST", f"/v1/turns/{turn_id}/tool-results", {"tool_call_id": "c", "content": "x"}),
        ("POST", f"/v1/turns/{turn_id}/cancel", {}),
        ("GET", "/v1/admin/turns/due", None),
        ("GET", "/v1/turns/turn_that_does_not_exist", None),
    ]


def test_no_or_bad_token_is_401_everywhere(secured: Any) -> None:
    create_agent(secured, "quick", scripted({"content": "hi"}), headers=ADMIN)
    turn = create_turn(secured, "quick", headers=CLIENT)
    wait_status(secured, turn["id"], "COMPLETED")
    before = secured.get(f"/v1/turns/{turn['id']}", headers=ADMIN).json()
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer "},
        {"Authorization": "Basic YzE6YzE="},
        {"Authorization": "c1"},
        {"Authorization": "Bearer c1x"},
    ):
        for method, path, body in _routes(turn["id"]):
            r = secured.request(method, path, json=body, headers=headers)
            problem(r, 401, "unauthorized")
            assert r.headers["www-authenticate"].lower().startswith("bearer")
    r = secured.get(f"/v1/turns/{turn['id']}/events", headers={"Accept": "text/event-stream"})
    problem(r, 401, "unauthorized")
    # nothing was created or changed by the refused requests
    assert [a["name"] for a in secured.get("/v1/agents", headers=ADMIN).json()["items"]] == [
        "quick"
    ]
    assert len(secured.get("/v1/turns", headers=ADMIN).json()["items"]) == 1
    assert secured.get(f"/v1/turns/{turn['id']}", headers=ADMIN).json() == before


def test_client_token_is_refused_admin_operations(secured: Any) -> None:
    r = secured.post(
        "/v1/agents", json={"name": "x", "model": scripted({"content": "x"})}, headers=CLIENT
    )
    problem(r, 403, "forbidden")
    assert secured.get("/v1/agents", headers=CLIENT).json()["items"] == []
    problem(secured.get("/v1/admin/turns/due", headers=CLIENT), 403, "forbidden")
    r = secured.get("/v1/admin/turns/due", headers=ADMIN)
    assert r.status_code == 200
    assert r.json() == {"items": []}


def test_client_token_does_the_rest(secured: Any) -> None:
    create_agent(secured, "quick", scripted({"content": "hi"}), headers=ADMIN)
    assert secured.get("/v1/agents", headers=CLIENT).status_code == 200
    assert secured.get("/v1/agents/quick", headers=CLIENT).json()["version"] == 1
    turn = create_turn(secured, "quick", "hello", headers=CLIENT)
    done = wait_status(secured, turn["id"], "COMPLETED")
    assert done["output"] == "hi"
    assert secured.get(f"/v1/turns/{turn['id']}", headers=CLIENT).status_code == 200
    assert secured.get("/v1/turns", headers=CLIENT).json()["items"][0]["id"] == turn["id"]
    assert secured.get(f"/v1/turns/{turn['id']}/messages", headers=CLIENT).status_code == 200
    assert secured.get(f"/v1/turns/{turn['id']}/events", headers=CLIENT).status_code == 200
    # a command with a client token reaches the turn (and its own answer: finished)
    problem(
        secured.post(f"/v1/turns/{turn['id']}/cancel", json={}, headers=CLIENT),
        409,
        "turn_finished",
    )


def test_force_retry_needs_an_admin_token(secured: Any) -> None:
    create_agent(
        secured,
        "later",
        scripted({"error": {"status": 503}}, {"content": "ok"}),
        policy=LATER,
        headers=ADMIN,
    )
    turn = create_turn(secured, "later", headers=CLIENT)
    parked = wait_status(secured, turn["id"], "RETRY_SCHEDULED")
    for body, path in (({"force": True}, "retry"), ({"command": "CONTINUE"}, "resume")):
        r = secured.post(f"/v1/turns/{turn['id']}/{path}", json=body, headers=CLIENT)
        problem(r, 403, "forbidden")
    assert secured.get(f"/v1/turns/{turn['id']}", headers=ADMIN).json() == parked
    # a plain retry with a client token is allowed, and answers not_due here
    r = secured.post(f"/v1/turns/{turn['id']}/retry", json={}, headers=CLIENT)
    problem(r, 409, "not_due")
    r = secured.post(f"/v1/turns/{turn['id']}/retry", json={"force": True}, headers=ADMIN)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "RUNNING"
    assert wait_status(secured, turn["id"], "COMPLETED")["output"] == "ok"


def test_operations_need_no_token(secured: Any) -> None:
    assert secured.get("/healthz").status_code == 200
    ready = secured.get("/readyz")
    assert ready.status_code == 200, ready.text
    metrics = secured.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "turnrunner_http_requests_total" in metrics.text


def test_readyz_on_a_migrated_database(api_only: Any) -> None:
    r = api_only.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready"
    assert api_only.get("/healthz").json() == {"status": "ok"}


@pytest.fixture
def unmigrated_url(db_url: str, tmp_path: Any) -> Iterator[str]:
    """An empty database of the same kind as db_url, never migrated."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"turnrunner_empty_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(db_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(db_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_readyz_is_503_on_a_database_not_migrated(unmigrated_url: str) -> None:
    with api_client(unmigrated_url, worker=False) as c:
        r = c.get("/readyz")
        problem(r, 503, "not_ready")
        assert c.get("/healthz").status_code == 200


# ---- body size -------------------------------------------------------------------------------


@pytest.fixture
def small(db_url: str) -> Iterator[Any]:
    with api_client(db_url, worker=False, max_body_bytes=2048) as c:
        yield c


def test_a_body_over_the_limit_is_413_and_stores_nothing(small: Any) -> None:
    big = "x" * 3000
    r = small.post(
        "/v1/agents", json={"name": "big", "description": big, "model": scripted({"content": "x"})}
    )
    problem(r, 413, "payload_too_large")
    assert small.get("/v1/agents").json()["items"] == []
    assert small.get("/v1/agents/big").status_code == 404

    create_agent(small, "a", scripted({"content": "x"}))
    problem(small.post("/v1/turns", json={"agent": "a", "input": big}), 413, "payload_too_large")
    assert small.get("/v1/turns").json()["items"] == []

    turn = create_turn(small, "a", "small enough")
    before = small.get(f"/v1/turns/{turn['id']}").json()
    problem(
        small.post(f"/v1/turns/{turn['id']}/messages", json={"content": big}),
        413,
        "payload_too_large",
    )
    assert small.get(f"/v1/turns/{turn['id']}").json() == before
    items = small.get(f"/v1/turns/{turn['id']}/messages").json()["items"]
    assert [m["content"] for m in items] == ["small enough"]


def test_a_streamed_body_over_the_limit_is_413(small: Any) -> None:
    """Without Content-Length (chunked), the limit holds while the body streams in."""
    create_agent(small, "a", scripted({"content": "x"}))

    def chunks() -> Iterator[bytes]:
        yield b'{"agent": "a", "input": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'

    r = small.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"})
    problem(r, 413, "payload_too_large")
    assert small.get("/v1/turns").json()["items"] == []

    def few() -> Iterator[bytes]:
        yield b'{"agent": "a", '
        yield b'"input": "fits"}'

    r = small.post("/v1/turns", content=few(), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
