"""Retention: delete terminal turns (with their messages and events) in bounded batches."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import delete, select

from app.domain.status import TERMINAL
from app.store.db import Database
from app.store.tables import idempotency_keys, turn_events, turn_inbox, turn_messages, turns
from app.store.types import utcnow

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta:
    """'30d', '12h', '90m', '45s', '2w' → timedelta; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def prune(db: Database, older_than: timedelta, batch: int = 500) -> int:
    """Delete terminal turns finished before now - older_than; returns how many."""
    cutoff = utcnow() - older_than
    total = 0
    while True:
        with db.transaction() as session:
            ids = list(
                session.execute(
                    select(turns.c.id)
                    .where(
                        turns.c.status.in_([s.value for s in TERMINAL]),
                        turns.c.finished_at < cutoff,
                    )
                    .limit(batch)
                ).scalars()
            )
            if not ids:
                return total
            # Children first: SQLite enforces foreign keys but not every build cascades.
            for table in (turn_messages, turn_events, turn_inbox, idempotency_keys):
                session.execute(delete(table).where(table.c.turn_id.in_(ids)))
            session.execute(delete(turns).where(turns.c.id.in_(ids)))
        total += len(ids)
