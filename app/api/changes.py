"""Waking long-polls and event streams when a turn changes, without sleep loops.

Changes arrive as hints: in-process commits (one process under `serve`) and, on PostgreSQL,
NOTIFY from any process. Waiters re-read the database after a hint, and at the latest after
`RECHECK_S`, so a lost hint costs a little latency, never a wrong answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Callable

from sqlalchemy import make_url

from app.store.db import Database
from app.store.notify import CHANGED, subscribe_local

log = logging.getLogger("turnrunner.api")
RECHECK_S = 5.0


class ChangeFeed:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: Callable[[], None] = lambda: None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def hint(channel: str, payload: str) -> None:
            if channel == CHANGED:
                loop.call_soon_threadsafe(self.changed, payload)

        self._unsubscribe = subscribe_local(hint)
        if self._db.is_postgres:
            self._tasks.append(asyncio.create_task(self._listen(), name="change-listener"))

    async def stop(self) -> None:
        self._unsubscribe()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def changed(self, turn_id: str) -> None:
        for event in self._waiters.get(turn_id, ()):
            event.set()

    @contextlib.asynccontextmanager
    async def watch(self, turn_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever `turn_id` may have changed; clear it before re-reading."""
        event = asyncio.Event()
        self._waiters[turn_id].add(event)
        try:
            yield event
        finally:
            self._waiters[turn_id].discard(event)
            if not self._waiters[turn_id]:
                del self._waiters[turn_id]

    async def _listen(self) -> None:
        import psycopg

        conninfo = (
            make_url(self._db.url)
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANGED}")
                    async for note in conn.notifies():
                        self.changed(note.payload)
            except (OSError, psycopg.Error):
                log.warning("change listener lost its connection; retrying")
                await asyncio.sleep(1 + random.random())


async def wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Wait for a hint, at most `timeout_s` (and never longer than RECHECK_S)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), min(timeout_s, RECHECK_S))
