"""The step writer seam: apply TurnUpdates, fenced, many turns per transaction (group commit).

A write is fenced either by the worker's lease token (a worker that lost its claim changes
nothing) or by the version the caller read (a command racing another writer changes nothing
and is retried by its caller). Sequence numbers of appended rows come from the same UPDATE that
locks the turn row, so rows of one turn are numbered in commit order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, insert, update
from sqlalchemy.orm import Session

from app import metrics
from app.domain.transcript import Message
from app.domain.update import TurnUpdate
from app.store.tables import turn_events, turn_inbox, turn_messages, turns
from app.store.types import utcnow


@dataclass(frozen=True)
class Fence:
    """What a write must still match: the lease token it holds, or the version it read."""

    lease_token: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class Applied:
    """What the database says after a write; `ok` False means the fence did not match."""

    ok: bool
    version: int = 0
    cancel_requested: bool = False
    cancel_reason: str | None = None
    inbox_pending: int = 0


FENCED_OUT = Applied(ok=False)


def message_row(turn_id: str, conversation_id: str, seq: int, m: Message, now: Any) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "seq": seq,
        "conversation_id": conversation_id,
        "role": m.role,
        "content": m.content,
        "tool_calls": [c.to_json() for c in m.tool_calls] if m.tool_calls else None,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
        "meta": ({**m.meta, "message_id": m.message_id} if m.message_id else m.meta) or None,
        "created_at": now,
    }


def apply_updates(session: Session, writes: list[tuple[str, Fence, TurnUpdate]]) -> list[Applied]:
    """Apply each turn's update in the caller's transaction; one Applied per write, in order."""
    now = utcnow()
    results: list[Applied] = []
    message_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    delivered: list[int] = []
    for turn_id, fence, upd in writes:
        values = dict(upd.values)
        values["updated_at"] = now
        values["version"] = turns.c.version + 1
        if upd.messages:
            values["message_count"] = turns.c.message_count + len(upd.messages)
        if upd.events:
            values["event_count"] = turns.c.event_count + len(upd.events)
        if upd.delivered_inbox:
            values["inbox_pending"] = turns.c.inbox_pending - len(upd.delivered_inbox)
        if upd.release_lease:
            values.update(lease_owner=None, lease_token=None, lease_expires_at=None)
        cond = [turns.c.id == turn_id]
        if fence.lease_token is not None:
            cond.append(turns.c.lease_token == fence.lease_token)
        if fence.version is not None:
            cond.append(turns.c.version == fence.version)
        row = session.execute(
            update(turns).where(and_(*cond)).values(values).returning(
                turns.c.version, turns.c.message_count, turns.c.event_count,
                turns.c.cancel_requested, turns.c.cancel_reason, turns.c.inbox_pending,
                turns.c.conversation_id, turns.c.agent_name,
            )
        ).one_or_none()
        if row is None:
            results.append(FENCED_OUT)
            continue
        first_msg = row.message_count - len(upd.messages) + 1
        message_rows.extend(
            message_row(turn_id, row.conversation_id, first_msg + i, m, now)
            for i, m in enumerate(upd.messages)
        )
        first_event = row.event_count - len(upd.events) + 1
        event_rows.extend(
            {"turn_id": turn_id, "seq": first_event + i, "type": t, "data": d, "created_at": now}
            for i, (t, d) in enumerate(upd.events)
        )
        delivered.extend(upd.delivered_inbox)
        if "status" in upd.values and upd.status.is_terminal:
            metrics.turns_finished.labels(row.agent_name, upd.status.value).inc()
        results.append(Applied(True, row.version, row.cancel_requested, row.cancel_reason,
                               row.inbox_pending))
    if message_rows:
        session.execute(insert(turn_messages), message_rows)
    if event_rows:
        session.execute(insert(turn_events), event_rows)
    if delivered:
        session.execute(
            update(turn_inbox).where(turn_inbox.c.id.in_(delivered)).values(delivered_at=now)
        )
    return results


def apply_update(session: Session, turn_id: str, fence: Fence, upd: TurnUpdate) -> Applied:
    """One turn's update; see apply_updates."""
    return apply_updates(session, [(turn_id, fence, upd)])[0]
