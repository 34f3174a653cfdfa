"""Agents: named, versioned definitions; a new create of a name adds a version."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.store.tables import agents
from app.store.types import utcnow


def create_version(session: Session, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Add the next version of `name` (1 for a new name) and return its row."""
    for _ in range(5):
        latest = session.execute(
            select(func.max(agents.c.version)).where(agents.c.name == name)
        ).scalar()
        row = {"name": name, "version": (latest or 0) + 1, "spec": spec, "created_at": utcnow()}
        try:
            with session.begin_nested():
                session.execute(insert(agents).values(row))
            return row
        except IntegrityError:
            continue  # another writer took that version number; take the next
    raise RuntimeError("could not allocate an agent version")


def get(session: Session, name: str, version: int | None = None) -> dict[str, Any] | None:
    """One version of an agent, the latest when `version` is None."""
    q = select(agents).where(agents.c.name == name)
    q = q.where(agents.c.version == version) if version else q.order_by(agents.c.version.desc())
    row = session.execute(q.limit(1)).mappings().first()
    return dict(row) if row else None


def list_latest(session: Session) -> list[dict[str, Any]]:
    """The latest version of every agent, by name."""
    latest = (
        select(agents.c.name, func.max(agents.c.version).label("version"))
        .group_by(agents.c.name)
        .subquery()
    )
    q = (
        select(agents)
        .join(latest, (agents.c.name == latest.c.name) & (agents.c.version == latest.c.version))
        .order_by(agents.c.name)
    )
    return [dict(r) for r in session.execute(q).mappings()]
