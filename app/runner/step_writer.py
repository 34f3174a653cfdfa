"""Group commit: the steps of many in-flight turns share one transaction.

Turns hand their step to `write()` and await it; a single writer task takes everything queued
and commits it in one transaction on a thread, so while one batch commits the next fills up."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app import metrics
from app.domain.update import TurnUpdate
from app.store import writer
from app.store.db import Database
from app.store.notify import CHANGED, notify_many
from app.store.writer import Applied, Fence


@dataclass
class _Pending:
    turn_id: str
    fence: Fence
    update: TurnUpdate
    done: asyncio.Future[Applied]


class StepWriter:
    def __init__(self, db: Database, max_batch: int = 128) -> None:
        self._db = db
        self._max_batch = max_batch
        self._queue: list[_Pending] = []
        self._ready = asyncio.Event()

    async def write(self, turn_id: str, lease_token: str, update: TurnUpdate) -> Applied:
        """Commit one step of a turn we hold; resolves once it is durable."""
        done: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(turn_id, Fence(lease_token=lease_token), update, done))
        self._ready.set()
        return await done

    async def run(self) -> None:
        """The writer task: commit whatever is queued, batch after batch, until cancelled."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        try:
            results = await asyncio.to_thread(self._commit, batch)
        except Exception as exc:
            if len(batch) > 1:
                # One bad step must not fail the others: commit each on its own.
                for p in batch:
                    await self._commit_batch([p])
                return
            if not batch[0].done.done():
                batch[0].done.set_exception(exc)
            return
        for p, r in zip(batch, results, strict=True):
            if not p.done.done():
                p.done.set_result(r)

    def _commit(self, batch: list[_Pending]) -> list[Applied]:
        with metrics.step_commit_duration.time(), self._db.transaction() as session:
            results = writer.apply_updates(session, [(p.turn_id, p.fence, p.update) for p in batch])
            notify_many(
                session, CHANGED, [p.turn_id for p, r in zip(batch, results, strict=True) if r.ok]
            )
        metrics.steps_committed.inc(sum(1 for r in results if r.ok))
        metrics.step_batch_size.observe(len(batch))
        return results
