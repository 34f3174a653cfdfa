"""Durable step throughput of one worker process on PostgreSQL, against the raw ceiling.

Prints:
  1. steps/s of one worker running many turns with the scripted instant model (group commit);
  2. the raw ceiling: plain psycopg, one INSERT + one UPDATE per transaction, same concurrency;
  3. their ratio;
  4. ms per step when a turn's history has 10 vs 1,000 messages.

Usage: python bench/steps.py [--url postgresql://postgres@127.0.0.1:5432/postgres]
       [--turns 400] [--tool-calls 25] [--concurrency 64]
It creates a throwaway database and drops it afterwards. Numbers, not assertions."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from prometheus_client import REGISTRY
from sqlalchemy import create_engine, func, select, text

from app.demo import DEMO_AGENT
from app.domain.agent import AgentSpec
from app.domain.policy import ExecutionPolicy
from app.domain.transcript import Message, ToolCall
from app.runner.worker import Worker
from app.settings import Settings
from app.store import agents, turns
from app.store.db import Database
from app.store.migrate import upgrade
from app.store.tables import turns as turns_table
from app.store.types import utcnow


def agent_spec(tool_calls: int) -> AgentSpec:
    """A scripted agent: `tool_calls` rounds of an instant async tool, then an answer."""
    base = DEMO_AGENT.model_dump(mode="json")
    base["name"] = "bench"
    base["tools"] = [
        {
            "name": "sleep",
            "description": "wait",
            "kind": "builtin",
            "builtin": "sleep",
            "parameters": {"type": "object"},
        }
    ]
    base["model"]["script"] = [
        {"tool_calls": [{"name": "sleep", "arguments": {"ms": 0}}]}
    ] * tool_calls + [{"content": "done"}]
    base["execution_policy"] = {"max_iterations": 100_000, "max_steps": 100_000}
    return AgentSpec.model_validate(base)


def seed(db: Database, n: int, history: int) -> None:
    """`n` READY turns of the bench agent, each with `history` messages already in it."""
    policy = ExecutionPolicy(max_iterations=100_000, max_steps=100_000).model_dump(mode="json")
    with db.transaction() as session:
        if agents.get(session, "bench") is None:
            agents.create_version(
                session, "bench", agent_spec(ARGS.tool_calls).model_dump(mode="json")
            )
        for _ in range(n):
            now = utcnow()
            tid = "turn_" + uuid.uuid4().hex
            msgs = [Message(role="system", content="bench")]
            # Resolved tool rounds, as a long-running turn would have accumulated.
            while len(msgs) < history - 1:
                call = ToolCall(f"old_{len(msgs)}", "sleep", {"ms": 0})
                msgs.append(Message(role="assistant", content=None, tool_calls=(call,)))
                msgs.append(Message(role="tool", content="{}", tool_call_id=call.id, name="sleep"))
            msgs.append(Message(role="user", content="go"))
            turns.insert_turn(
                session,
                {
                    "id": tid,
                    "agent_name": "bench",
                    "agent_version": 1,
                    "conversation_id": "conv_" + uuid.uuid4().hex,
                    "status": "READY",
                    "created_at": now,
                    "updated_at": now,
                    "execution_policy": policy,
                    "pending_tool_calls": [],
                    "metadata": {},
                },
                msgs,
                ("created", {}),
            )


def completed(db: Database) -> int:
    with db.transaction() as session:
        q = select(func.count()).where(turns_table.c.status == "COMPLETED")
        return int(session.execute(q).scalar_one())


@dataclass
class Run:
    elapsed_s: float  # wall time to finish every turn, claims and transcript loads included
    steady_ms_per_step: float  # after the last claim: the cost of a step alone
    load_ms_per_turn: float  # claim + transcript load, once per claim
    commit_ms_per_step: float  # the database's share: group-commit time per step


async def run_worker(db: Database, n: int, concurrency: int) -> Run:
    """One worker finishing `n` seeded turns."""
    settings = Settings(database_url=db.url, poll_interval_ms=20, register_demo_agent=False)
    worker = Worker(db, settings, concurrency=concurrency)
    claim = worker._claim
    marks: dict[str, float] = {"claimed": 0, "load_s": 0.0}

    def timed_claim(limit: int) -> Any:
        t = time.perf_counter()
        loaded = claim(limit)
        if loaded:
            marks["load_s"] += time.perf_counter() - t
            marks["claimed"] += len(loaded)
            marks["at"], marks["steps_at"] = time.perf_counter(), _committed()
        return loaded

    worker._claim = timed_claim  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    started = time.perf_counter()
    steps_before, commit_s_before = _committed(), _commit_seconds()
    while await asyncio.to_thread(completed, db) < n:
        await asyncio.sleep(0.02)
    end = time.perf_counter()
    worker.stop()
    await task
    steady_steps = _committed() - marks["steps_at"]
    steps = max(1.0, _committed() - steps_before)
    return Run(
        end - started,
        (end - marks["at"]) * 1000 / max(1.0, steady_steps),
        marks["load_s"] * 1000 / max(1.0, marks["claimed"]),
        (_commit_seconds() - commit_s_before) * 1000 / steps,
    )


def _commit_seconds() -> float:
    return float(REGISTRY.get_sample_value("turnrunner_step_commit_duration_seconds_sum") or 0.0)


def _committed() -> float:
    return float(REGISTRY.get_sample_value("turnrunner_steps_committed_total") or 0.0)


def steps_of(db: Database) -> int:
    with db.transaction() as session:
        return int(session.execute(select(func.sum(turns_table.c.steps))).scalar_one() or 0)


def reset(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.execute(text("TRUNCATE turns, turn_messages, turn_events, turn_inbox CASCADE"))


async def raw_ceiling(conninfo: str, concurrency: int, seconds: float) -> float:
    """Transactions/s of plain psycopg: one INSERT + one UPDATE per transaction."""
    setup = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    await setup.execute(
        "CREATE TABLE IF NOT EXISTS bench_rows (id bigserial PRIMARY KEY, k int, payload jsonb)"
    )
    await setup.execute("CREATE TABLE IF NOT EXISTS bench_state (k int PRIMARY KEY, n int)")
    await setup.execute(
        "INSERT INTO bench_state SELECT g, 0 FROM generate_series(0, %s) g ON CONFLICT DO NOTHING",
        (concurrency,),
    )
    await setup.close()
    done = 0
    deadline = time.perf_counter() + seconds

    async def one(k: int) -> None:
        nonlocal done
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            while time.perf_counter() < deadline:
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO bench_rows (k, payload) VALUES (%s, %s)",
                        (k, '{"role": "tool", "content": "{}"}'),
                    )
                    await conn.execute("UPDATE bench_state SET n = n + 1 WHERE k = %s", (k,))
                done += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(concurrency)))
    return done / (time.perf_counter() - started)


async def main() -> None:
    admin = create_engine(
        ARGS.url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
    )
    name = f"turnrunner_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    db = Database(url)
    try:
        upgrade(db)
        steps_per_turn = 2 * ARGS.tool_calls + 1

        seed(db, ARGS.turns, 2)
        elapsed = (await run_worker(db, ARGS.turns, ARGS.concurrency)).elapsed_s
        steps = steps_of(db)
        ours = steps / elapsed
        print(
            f"worker: {ARGS.turns} turns x {steps_per_turn} steps = {steps} durable steps "
            f"in {elapsed:.2f} s -> {ours:,.0f} steps/s (concurrency {ARGS.concurrency})"
        )

        conninfo = admin.url.set(database=name, drivername="postgresql").render_as_string(
            hide_password=False
        )
        raw = await raw_ceiling(conninfo, ARGS.concurrency, 5.0)
        print(
            f"raw ceiling: {raw:,.0f} tx/s (psycopg, INSERT + UPDATE per transaction, "
            f"{ARGS.concurrency} connections)"
        )
        print(f"ratio: {ours / raw:.2f}")

        # Alternate the two cases, several rounds, and take medians: the machine is noisy.
        runs: dict[int, list[Run]] = {10: [], 1000: []}
        for _ in range(ARGS.rounds):
            for history in runs:
                reset(db)
                # Every turn is claimed at once, so what follows the last claim is steps alone.
                seed(db, ARGS.concurrency, history)
                run = await run_worker(db, ARGS.concurrency, ARGS.concurrency)
                run.elapsed_s /= steps_of(db)  # now seconds per step, claims included
                runs[history].append(run)
        per_step = {}
        for history, done in runs.items():
            per_step[history] = statistics.median(r.steady_ms_per_step for r in done)
            print(
                f"history {history:>5} messages: {per_step[history]:.3f} ms per step "
                f"(steady state, median of {len(done)} runs of {ARGS.concurrency} turns); "
                f"claim + transcript load "
                f"{statistics.median(r.load_ms_per_turn for r in done):.1f} ms per turn, once "
                f"per claim; overall {statistics.median(r.elapsed_s for r in done) * 1000:.3f} "
                "ms per step; database commit "
                f"{statistics.median(r.commit_ms_per_step for r in done):.3f} ms per step"
            )
        print(f"1,000 vs 10 messages: {per_step[1000] / per_step[10]:.2f}x time per step")
    finally:
        db.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--tool-calls", type=int, default=25)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="runs per history length")
    ARGS = parser.parse_args()
    asyncio.run(main())
