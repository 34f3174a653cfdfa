"""Two worker processes on one database race for 200 turns: each turn is run to COMPLETED exactly
once, no step is recorded twice, and every turn's event log is gap-free."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from tests.e2e.conftest import Api, Launcher
from tests.helpers import CALCULATOR

TURNS = 200


def _check_turn(api: Api, turn_id: str) -> list[str]:
    """Everything wrong with one turn's record (empty when it is right)."""
    problems: list[str] = []
    turn = api.turn(turn_id)
    if turn["status"] != "COMPLETED" or turn["output"] != "8":
        problems.append(f"{turn_id}: {turn['status']} {turn['output']!r}")
    events = api.events(turn_id)
    seqs = [e["seq"] for e in events]
    if seqs != list(range(1, len(events) + 1)):
        problems.append(f"{turn_id}: event seqs {seqs}")
    completed = [
        e for e in events if e["type"] == "status_changed" and e["data"]["to"] == "COMPLETED"
    ]
    if len(completed) != 1:
        problems.append(f"{turn_id}: {len(completed)} COMPLETED events")
    attempts = [e["data"]["attempt"] for e in events if e["type"] == "model_attempt"]
    if attempts != [1, 2]:
        problems.append(f"{turn_id}: model attempts {attempts}")
    tool_runs = [e["data"]["tool_call_id"] for e in events if e["type"] == "tool_attempt"]
    if len(tool_runs) != 1:
        problems.append(f"{turn_id}: tool attempts {tool_runs}")
    messages = api.messages(turn_id)
    roles = [m["role"] for m in messages]
    if roles != ["user", "assistant", "tool", "assistant"]:
        problems.append(f"{turn_id}: roles {roles}")
    results = Counter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    if any(n != 1 for n in results.values()):
        problems.append(f"{turn_id}: tool results {dict(results)}")
    if [m["seq"] for m in messages] != list(range(1, len(messages) + 1)):
        problems.append(f"{turn_id}: message seqs")
    return problems


def test_two_workers_run_every_turn_exactly_once(launch: Launcher) -> None:
    api = launch.api()
    api.create_agent(
        "fence",
        {
            "provider": "scripted",
            "model": "script",
            "script": [
                {"tool_calls": [{"name": "calculator", "arguments": {"expression": "3+5"}}]},
                {"content": "8"},
            ],
        },
        tools=[CALCULATOR],
    )
    # Both workers are up (and polling, and listening) before the first turn exists, so they
    # race for every one of them.
    workers = [launch.worker(f"worker-{n}", wait=False) for n in ("a", "b")]
    for w in workers:
        w.wait_ready()

    with ThreadPoolExecutor(max_workers=4) as pool:
        ids = list(pool.map(lambda i: api.create_turn("fence", f"turn {i}")["id"], range(TURNS)))
    assert len(set(ids)) == TURNS

    deadline = time.monotonic() + 90
    while True:
        r = api.http.get(
            "/v1/turns", params={"agent": "fence", "limit": 200, "status": ["READY", "RUNNING"]}
        )
        assert r.status_code == 200, r.text
        if not r.json()["items"]:
            break
        assert time.monotonic() < deadline, f"{len(r.json()['items'])} turns still running"
        time.sleep(0.1)

    with ThreadPoolExecutor(max_workers=8) as pool:
        problems = [p for found in pool.map(lambda t: _check_turn(api, t), ids) for p in found]
    assert problems == [], problems[:20]

    # Each turn was finished by exactly one worker, and both workers took part.
    finished = [
        w.metric("turnrunner_turns_finished_total", agent="fence", status="COMPLETED")
        for w in workers
    ]
    assert sum(finished) == TURNS, finished
    assert all(n > 0 for n in finished), finished
    for w in workers:
        assert w.proc.poll() is None, "a worker died"
