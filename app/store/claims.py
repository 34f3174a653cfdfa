"""Claiming runnable turns under a lease, renewing it, and giving it back.

The only place with locking SQL. On PostgreSQL the claim is one statement: a CTE picks
runnable rows with FOR UPDATE SKIP LOCKED, the UPDATE re-checks and takes them. SQLite has a
single writer (BEGIN IMMEDIATE), so the same UPDATE without the lock clause is just as safe."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.orm import Session

from app.domain.status import TERMINAL, TurnStatus
from app.store.tables import turns
from app.store.types import utcnow

_TERMINAL = [s.value for s in TERMINAL]


def _runnable(now: datetime, scheduler: bool) -> Any:
    due_retry = (
        and_(turns.c.status == TurnStatus.RETRY_SCHEDULED.value, turns.c.next_runnable_at <= now)
        if scheduler
        else false()
    )
    return and_(
        or_(turns.c.lease_expires_at.is_(None), turns.c.lease_expires_at < now),
        or_(
            turns.c.status.in_([TurnStatus.READY.value, TurnStatus.RUNNING.value]),
            due_retry,
            and_(turns.c.cancel_requested, turns.c.status.not_in(_TERMINAL)),
        ),
    )


def claim(
    session: Session, owner: str, limit: int, lease_ttl: timedelta, scheduler: bool
) -> list[dict[str, Any]]:
    """Lease up to `limit` runnable turns to `owner`. The status is left as it was: the
    worker's first step moves it (through the transition table, with its event)."""
    if limit <= 0:
        return []
    now = utcnow()
    pick = (
        select(turns.c.id)
        .where(_runnable(now, scheduler))
        .order_by(func.coalesce(turns.c.next_runnable_at, turns.c.created_at))
        .limit(limit)
    )
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    picked = pick.cte("picked")
    stmt = (
        update(turns)
        # Re-checked: a row picked without a lock (SQLite) may have changed meanwhile.
        .where(turns.c.id.in_(select(picked.c.id)), _runnable(now, scheduler))
        .values(
            lease_owner=owner,
            lease_token=uuid.uuid4().hex,
            lease_expires_at=now + lease_ttl,
        )
        .returning(*turns.c)
    )
    return [dict(r) for r in session.execute(stmt).mappings()]


def renew(session: Session, owner: str, tokens: list[str], lease_ttl: timedelta) -> set[str]:
    """Extend the leases `owner` still holds; returns the tokens that are still ours."""
    if not tokens:
        return set()
    rows = session.execute(
        update(turns)
        .where(turns.c.lease_owner == owner, turns.c.lease_token.in_(tokens))
        .values(lease_expires_at=utcnow() + lease_ttl)
        .returning(turns.c.lease_token)
    ).scalars()
    return set(rows)


def release(session: Session, turn_id: str, token: str) -> None:
    """Give back a claim without changing the turn (graceful shutdown): runnable again at once."""
    session.execute(
        update(turns)
        .where(turns.c.id == turn_id, turns.c.lease_token == token)
        .values(lease_owner=None, lease_token=None, lease_expires_at=None)
    )


def cancel_flagged(session: Session, owner: str) -> dict[str, str | None]:
    """Turns `owner` holds whose cancel was requested, with the reason given."""
    rows = session.execute(
        select(turns.c.id, turns.c.cancel_reason).where(
            turns.c.lease_owner == owner, turns.c.cancel_requested
        )
    )
    return {turn_id: reason for turn_id, reason in rows}


def due_retries(session: Session, limit: int) -> list[dict[str, Any]]:
    """RETRY_SCHEDULED turns whose time has come, oldest due first."""
    q = (
        select(turns)
        .where(
            turns.c.status == TurnStatus.RETRY_SCHEDULED.value, turns.c.next_runnable_at <= utcnow()
        )
        .order_by(turns.c.next_runnable_at)
        .limit(limit)
    )
    return [dict(r) for r in session.execute(q).mappings()]


def status_counts(session: Session) -> dict[str, int]:
    """Live turns per non-terminal status; uses the status index, not a table scan."""
    q = (
        select(turns.c.status, func.count())
        .where(turns.c.status.not_in(_TERMINAL))
        .group_by(turns.c.status)
    )
    return {s: n for s, n in session.execute(q)}
