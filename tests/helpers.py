"""Small helpers shared by tests: agents, turns, waiting for a status."""

from __future__ import annotations

import time
from typing import Any

from app.domain.status import TurnStatus
from app.tools.builtins import builtin_tool_spec

TERMINAL = {s.value for s in TurnStatus if s.is_terminal}

CALCULATOR = builtin_tool_spec("calculator")


def scripted(*replies: dict[str, Any]) -> dict[str, Any]:
    return {"provider": "scripted", "model": "script", "script": list(replies)}


def create_agent(
    client: Any,
    name: str,
    model: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    policy: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "model": model, "tools": tools or [], **extra}
    if policy is not None:
        body["execution_policy"] = policy
    r = client.post("/v1/agents", json=body, headers=headers or {})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def create_turn(
    client: Any, agent: str, input_: str = "hi", headers: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    r = client.post(
        "/v1/turns", json={"agent": agent, "input": input_, **extra}, headers=headers or {}
    )
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def wait_status(
    client: Any,
    turn_id: str,
    statuses: set[str] | str,
    timeout_s: float = 20.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Poll until the turn is in one of `statuses`; fail with its last state otherwise."""
    wanted = {statuses} if isinstance(statuses, str) else statuses
    deadline = time.monotonic() + timeout_s
    turn: dict[str, Any] = {}
    while time.monotonic() < deadline:
        turn = client.get(f"/v1/turns/{turn_id}", headers=headers or {}).json()
        if turn["status"] in wanted:
            return turn
        time.sleep(0.02)
    raise AssertionError(f"turn {turn_id} never reached {wanted}; last: {turn}")


def messages(client: Any, turn_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/turns/{turn_id}/messages").json()["items"]  # type: ignore[no-any-return]


def events(client: Any, turn_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/turns/{turn_id}/events").json()["items"]  # type: ignore[no-any-return]
