"""The FastAPI application: create_app() and its lifespan. Routes live in app/api."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from fastapi import FastAPI

from app import metrics
from app.api import agents, commands, openapi, ops, problems, turns
from app.api.changes import ChangeFeed
from app.api.middleware import BodyLimit, HttpMetrics
from app.settings import Settings, get_settings
from app.store import claims
from app.store.db import Database
from app.store.prune import prune

log = logging.getLogger("turnrunner.api")
GAUGE_REFRESH_S = 5.0
PRUNE_EVERY_S = 60.0


async def _refresh_status_gauge(db: Database) -> None:
    """turnrunner_turns{status} from the database (all processes), every few seconds, so a
    scrape never costs a query."""
    seen: set[str] = set()
    while True:
        try:
            counts = await asyncio.to_thread(_status_counts, db)
            for status in seen | set(counts):
                metrics.turns.labels(status).set(counts.get(status, 0))
            seen |= set(counts)
        except Exception:
            log.warning("could not refresh the turn status gauge", exc_info=True)
        await asyncio.sleep(GAUGE_REFRESH_S)


async def _prune_periodically(db: Database, older_than: timedelta) -> None:
    """Retention (TURNRUNNER_PRUNE_AFTER_MS): delete old terminal turns in bounded batches.
    Safe in many processes at once: each batch deletes what is still there."""
    while True:
        try:
            removed = await asyncio.to_thread(prune, db, older_than)
            if removed:
                log.info("pruned terminal turns", extra={"turns": removed})
        except Exception:
            log.warning("pruning failed; trying again later", exc_info=True)
        await asyncio.sleep(PRUNE_EVERY_S)


def _status_counts(db: Database) -> dict[str, int]:
    with db.transaction() as session:
        return claims.status_counts(session)


def create_app(
    settings: Settings | None = None, db: Database | None = None, run_worker: bool = False
) -> FastAPI:
    """The API; with run_worker, an in-process worker runs beside it (`turnrunner serve`)."""
    settings = settings or get_settings()
    metrics.init_label_sets(api=True, runner=run_worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = db or Database(settings.database_url)
        app.state.db = database
        app.state.changes = ChangeFeed(database)
        await app.state.changes.start()
        background = [asyncio.create_task(_refresh_status_gauge(database), name="status-gauge")]
        if settings.prune_after_ms:
            background.append(
                asyncio.create_task(
                    _prune_periodically(database, timedelta(milliseconds=settings.prune_after_ms)),
                    name="prune",
                )
            )
        worker = None
        if run_worker:
            from app.runner.worker import Worker

            worker = Worker(database, settings)
            background.append(asyncio.create_task(worker.run(), name="worker"))
        try:
            yield
        finally:
            if worker is not None:
                worker.stop()
            for task in background:
                if task.get_name() != "worker":
                    task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await app.state.changes.stop()
            if db is None:
                database.dispose()

    app = FastAPI(
        title="turnrunner",
        version="0.1.0",
        summary="Durable agent-turn execution: model → tools → model, every step persisted.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    problems.install(app)
    openapi.install(app)
    for module in (agents, turns, commands, ops):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(HttpMetrics)
    return app
