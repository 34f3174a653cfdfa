"""The worker: claims runnable turns under a lease and runs up to N of them at once.

Anatomy (after procrastinate): a claim loop bounded by a concurrency limit, and named side
tasks — step writer, heartbeat, cancel watcher, NOTIFY listener — watched so that one failing
stops the worker loudly. NOTIFY is a hint; the jittered poll is the contract."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import make_url
from sqlalchemy.exc import InterfaceError, OperationalError

from app.domain.agent import AgentSpec
from app.models.registry import ModelRegistry
from app.runner.execution import Loaded, Runtime, TurnExecution
from app.runner.step_writer import StepWriter
from app.settings import Settings
from app.store import agents as agents_store
from app.store import claims
from app.store import turns as turns_store
from app.store.db import Database
from app.store.notify import CANCEL, WAKE, subscribe_local
from app.tools.execute import ToolRunner
from app.tools.http import HttpToolExecutor

log = logging.getLogger("turnrunner.worker")
T = TypeVar("T")

SHUTDOWN_GRACE_S = 10.0


class Worker:
    def __init__(self, db: Database, settings: Settings, concurrency: int | None = None) -> None:
        self.db = db
        self.settings = settings
        self.concurrency = concurrency or settings.worker_concurrency
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ttl = timedelta(milliseconds=settings.lease_ttl_ms)
        self.running: dict[str, tuple[TurnExecution, asyncio.Task[None]]] = {}
        self._agents: dict[tuple[str, int], AgentSpec] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    # ---- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; finish or hand back what is held (safe from a signal handler)."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Run until stop(); raises if a side task fails."""
        loop = asyncio.get_running_loop()
        writer = StepWriter(self.db)
        models = ModelRegistry()
        tools = ToolRunner(HttpToolExecutor(allowlist=self.settings.allowlist))
        self.rt = Runtime(self.db, writer, tools, models, self.owner)

        def hint(channel: str, payload: str) -> None:  # called from the committing thread
            loop.call_soon_threadsafe(self._on_hint, channel, payload)

        unsubscribe = subscribe_local(hint)
        side = [
            asyncio.create_task(writer.run(), name="step-writer"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._watch_cancels(), name="cancel-watcher"),
        ]
        if self.db.is_postgres:
            side.append(asyncio.create_task(self._listen(), name="listener"))
        main = asyncio.create_task(self._claim_loop(), name="claim-loop")
        log.info("worker started", extra={"worker": self.owner, "concurrency": self.concurrency})
        try:
            done, _ = await asyncio.wait([main, *side], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not main and t.exception() is not None:
                    log.error("side task %s failed; stopping", t.get_name())
                    self.stop()
            await main
            await self._drain()
            for t in done:
                if t is not main and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            unsubscribe()
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            await models.aclose()
            await tools.aclose()
            log.info("worker stopped", extra={"worker": self.owner})

    async def _drain(self) -> None:
        """Let in-flight steps finish, then hand back whatever is still held."""
        for ex, _ in self.running.values():
            ex.stop()
        tasks = [t for _, t in self.running.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
        leftover = [(tid, ex.token, t) for tid, (ex, t) in self.running.items() if not t.done()]
        for _, _, t in leftover:
            t.cancel()
        await asyncio.gather(*(t for _, _, t in leftover), return_exceptions=True)
        for tid, token, _ in leftover:
            await asyncio.to_thread(self._release, tid, token)

    async def _in_db(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """A database call on a thread; a database that is briefly away costs a poll, not the
        worker (None then)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (OperationalError, InterfaceError):
            log.warning("database unavailable (%s); trying again", what, exc_info=True)
            return None

    def _release(self, turn_id: str, token: str) -> None:
        with self.db.transaction() as session:
            claims.release(session, turn_id, token)

    # ---- claiming ----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.concurrency - len(self.running)
            claimed = (await self._in_db("claim", self._claim, free) or []) if free > 0 else []
            for loaded in claimed:
                self._start(loaded)
            if free > 0 and len(claimed) == free:
                continue  # there may be more waiting
            self._wake.clear()
            timeout = self.settings.poll_interval_ms / 1000 * random.uniform(0.5, 1.5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _claim(self, limit: int) -> list[Loaded]:
        with self.db.transaction() as session:
            rows = claims.claim(
                session, self.owner, limit, self.lease_ttl, self.settings.scheduler_enabled
            )
            return [self._load(session, row) for row in rows]

    def _load(self, session: Any, row: dict[str, Any]) -> Loaded:
        key = (row["agent_name"], row["agent_version"])
        agent = self._agents.get(key)
        if agent is None:  # agent versions never change, so they are cached for good
            agent_row = agents_store.get(session, *key)
            assert agent_row is not None, f"turn {row['id']} names a missing agent {key}"
            agent = self._agents[key] = AgentSpec.model_validate(agent_row["spec"])
        messages = turns_store.transcript(session, row["id"])
        history = (
            turns_store.conversation_history(session, row["conversation_id"], row["id"])
            if row["conversation_id"]
            else []
        )
        inbox = turns_store.undelivered_inbox(session, row["id"]) if row["inbox_pending"] else []
        return Loaded(row, agent, messages, history, inbox)

    def _start(self, loaded: Loaded) -> None:
        ex = TurnExecution(loaded, self.rt)
        task = asyncio.create_task(ex.run(), name=f"turn:{ex.turn_id}")
        self.running[ex.turn_id] = (ex, task)

        def finished(_: asyncio.Task[None], turn_id: str = ex.turn_id) -> None:
            self.running.pop(turn_id, None)
            self._wake.set()  # a slot is free

        task.add_done_callback(finished)

    # ---- side tasks --------------------------------------------------------------------

    def _on_hint(self, channel: str, payload: str) -> None:
        if channel == WAKE:
            self._wake.set()
        elif channel == CANCEL and payload in self.running:
            self.running[payload][0].request_cancel()

    async def _heartbeat(self) -> None:
        interval = self.settings.lease_ttl_ms / 3000
        while True:
            await asyncio.sleep(interval)
            held = {ex.token: tid for tid, (ex, _) in self.running.items()}
            kept = await self._in_db("heartbeat", self._renew, list(held))
            if kept is None:
                continue  # unknown, not lost: fencing guards us if it expires meanwhile
            for token, tid in held.items():
                if token not in kept and tid in self.running:
                    log.warning("lease lost", extra={"turn_id": tid})
                    self.running[tid][1].cancel()

    def _renew(self, tokens: list[str]) -> set[str]:
        with self.db.transaction() as session:
            return claims.renew(session, self.owner, tokens, self.lease_ttl)

    async def _watch_cancels(self) -> None:
        """Polling half of cancel delivery: NOTIFY is faster, this is what we rely on."""
        interval = self.settings.cancel_poll_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self.running:
                continue
            flagged = await self._in_db("cancel watch", self._cancel_flagged) or {}
            for tid, reason in flagged.items():
                if tid in self.running and not self.running[tid][0].cancel_requested:
                    self.running[tid][0].request_cancel(reason)

    def _cancel_flagged(self) -> dict[str, str | None]:
        with self.db.transaction() as session:
            return claims.cancel_flagged(session, self.owner)

    async def _listen(self) -> None:
        """LISTEN for wake and cancel hints; reconnects, since polling covers any gap."""
        import psycopg

        conninfo = (
            make_url(self.db.url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {WAKE}")
                    await conn.execute(f"LISTEN {CANCEL}")
                    async for note in conn.notifies():
                        self._on_hint(note.channel, note.payload)
            except (OSError, psycopg.Error):
                log.warning("LISTEN connection lost; polling until it is back")
                await asyncio.sleep(1 + random.random())
