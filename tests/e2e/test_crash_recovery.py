"""A worker dies (SIGKILL) or is told to stop (SIGTERM) while its turn is inside a slow `http`
tool; another worker process finishes the turn, and nothing is recorded twice."""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

from sqlalchemy import create_engine, text

from tests.e2e.conftest import Api, Launcher, ToolServer, WorkerProcess

LEASE_TTL_MS = "1500"


def _agent(api: Api, name: str, tools: ToolServer, slow_ms: int) -> None:
    slow = {
        "name": "slow",
        "description": "slow",
        "kind": "http",
        "url": tools.url(f"/slow?ms={slow_ms}"),
        "timeout_ms": 20_000,
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
    }
    model = {
        "provider": "scripted",
        "model": "script",
        "script": [
            {"tool_calls": [{"name": "slow", "arguments": {"order": "A-17"}}]},
            {"content": "refund done"},
        ],
    }
    api.create_agent(name, model, tools=[slow])


def _wait_tool_requests(
    tools: ToolServer, turn_id: str, n: int, timeout_s: float = 20.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while len(seen := tools.requests(turn_id)) < n:
        assert time.monotonic() < deadline, f"the tool server saw {len(seen)} of {n} requests"
        time.sleep(0.02)
    return seen


def _holder(
    launch: Launcher, turn_id: str, workers: list[WorkerProcess]
) -> tuple[WorkerProcess, WorkerProcess]:
    """(the worker whose lease the turn is under, the other one), read from the database."""
    engine = create_engine(launch.db_url)
    try:
        with engine.connect() as conn:
            owner = conn.execute(
                text("SELECT lease_owner FROM turns WHERE id = :id"), {"id": turn_id}
            ).scalar_one()
    finally:
        engine.dispose()
    assert owner, "nobody holds the turn"
    (holder,) = [w for w in workers if f":{w.proc.pid}:" in owner]
    (other,) = [w for w in workers if w is not holder]
    return holder, other


def _start_two(launch: Launcher) -> list[WorkerProcess]:
    """Two idle workers, both up before any turn exists (so no start-up race decides)."""
    workers = [
        launch.worker(name, wait=False, TURNRUNNER_LEASE_TTL_MS=LEASE_TTL_MS)
        for name in ("worker-a", "worker-b")
    ]
    for w in workers:
        w.wait_ready()
    return workers


def _assert_recorded_once(api: Api, turn_id: str) -> list[dict[str, Any]]:
    messages = api.messages(turn_id)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"], messages
    calls = [c["id"] for m in messages for c in (m.get("tool_calls") or [])]
    results = Counter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    assert results == Counter(calls), messages
    events = api.events(turn_id)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    attempts = [e["data"]["attempt"] for e in events if e["type"] == "model_attempt"]
    assert attempts == [1, 2]
    assert [e["data"]["outcome"] for e in events if e["type"] == "tool_attempt"] == ["ok"]
    completed = [
        e for e in events if e["type"] == "status_changed" and e["data"]["to"] == "COMPLETED"
    ]
    assert len(completed) == 1
    return events


def test_sigkilled_worker_turn_is_finished_by_another(
    launch: Launcher, tool_server: ToolServer
) -> None:
    api = launch.api()
    workers = _start_two(launch)
    _agent(api, "refunds", tool_server, slow_ms=2000)
    turn = api.create_turn("refunds", "refund order A-17")
    turn_id = turn["id"]
    (seen_first,) = _wait_tool_requests(tool_server, turn_id, 1)
    assert api.turn(turn_id)["status"] == "RUNNING"
    first, second = _holder(launch, turn_id, workers)

    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(timeout=10) == -signal.SIGKILL
    killed_at = time.monotonic()

    # The other worker runs the tool again, but only once the dead one's lease ran out
    # (1.5 s, renewed every 0.5 s).
    runs = _wait_tool_requests(tool_server, turn_id, 2)
    assert time.monotonic() - killed_at >= 0.8
    done = api.wait_terminal(turn_id, timeout_s=30)
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "refund done"

    # The tool ran twice (the first run's result was never recorded), with one key.
    runs = tool_server.requests(turn_id)
    assert len(runs) == 2
    events = _assert_recorded_once(api, turn_id)
    call_id = api.messages(turn_id)[1]["tool_calls"][0]["id"]
    key = f"{turn_id}:{call_id}"
    assert [r["idempotency_key"] for r in runs] == [key, key]
    assert (
        seen_first["body"]
        == runs[1]["body"]
        == {"turn_id": turn_id, "tool_call_id": call_id, "arguments": {"order": "A-17"}}
    )
    claimed = [e["data"]["worker"] for e in events if e["type"] == "claimed"]
    assert len(claimed) == 1 and f":{second.proc.pid}:" in claimed[0]
    assert done["counters"]["tool_calls"] == 1 and done["counters"]["iterations"] == 2
    assert (
        second.metric("turnrunner_turns_finished_total", agent="refunds", status="COMPLETED") == 1
    )


def test_sigterm_finishes_the_step_and_hands_the_turn_over(
    launch: Launcher, tool_server: ToolServer
) -> None:
    api = launch.api()
    workers = _start_two(launch)
    _agent(api, "refunds", tool_server, slow_ms=3000)
    turn_id = api.create_turn("refunds", "refund order A-17")["id"]
    _wait_tool_requests(tool_server, turn_id, 1)
    first, second = _holder(launch, turn_id, workers)

    first.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # It finishes the tool call in flight, records it, hands the turn back and exits.
    assert first.proc.wait(timeout=15) == 0
    assert "worker stopped" in first.log.read_text()
    # It did not leave at once: it waited for the tool call (3 s from its start) to finish.
    assert time.monotonic() - signalled > 0.5

    done = api.wait_terminal(turn_id, timeout_s=30)
    assert done["status"] == "COMPLETED", done
    assert done["output"] == "refund done"
    # The step in flight was finished, not lost: the tool ran exactly once.
    (run,) = tool_server.requests(turn_id)
    events = _assert_recorded_once(api, turn_id)
    kinds = [e["type"] for e in events]
    # Recorded by the first worker before it left; the rest by the second.
    assert kinds.index("tool_attempt") < kinds.index("claimed")
    claimed = [e["data"]["worker"] for e in events if e["type"] == "claimed"]
    assert len(claimed) == 1 and f":{second.proc.pid}:" in claimed[0]
    assert run["idempotency_key"] == f"{turn_id}:{api.messages(turn_id)[2]['tool_call_id']}"
    assert (
        second.metric("turnrunner_turns_finished_total", agent="refunds", status="COMPLETED") == 1
    )
