"""Turns: create, read, list, and the transcript and event log of each."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.orm import Session

from app.domain.status import TurnStatus
from app.domain.transcript import Message, ToolCall
from app.store.tables import idempotency_keys, turn_events, turn_inbox, turn_messages, turns
from app.store.types import utcnow
from app.store.writer import message_row


def insert_turn(
    session: Session,
    row: dict[str, Any],
    first_messages: list[Message],
    first_event: tuple[str, dict[str, Any]],
) -> None:
    """Insert a new turn with its opening messages and event; the caller commits."""
    now = row["created_at"]
    session.execute(
        insert(turns).values(
            **row,
            message_count=len(first_messages),
            event_count=1,
            version=1,
        )
    )
    session.execute(
        insert(turn_messages),
        [
            message_row(row["id"], row["conversation_id"], i + 1, m, now)
            for i, m in enumerate(first_messages)
        ],
    )
    session.execute(
        insert(turn_events).values(
            turn_id=row["id"],
            seq=1,
            type=first_event[0],
            data=first_event[1],
            created_at=now,
        )
    )


def get(session: Session, turn_id: str) -> dict[str, Any] | None:
    row = session.execute(select(turns).where(turns.c.id == turn_id)).mappings().first()
    return dict(row) if row else None


def find_idempotent(session: Session, key: str) -> dict[str, Any] | None:
    row = (
        session.execute(select(idempotency_keys).where(idempotency_keys.c.key == key))
        .mappings()
        .first()
    )
    return dict(row) if row else None


def save_idempotency_key(session: Session, key: str, request_hash: str, turn_id: str) -> None:
    session.execute(
        insert(idempotency_keys).values(
            key=key, request_hash=request_hash, turn_id=turn_id, created_at=utcnow()
        )
    )


def list_page(
    session: Session,
    *,
    statuses: list[TurnStatus] | None,
    agent: str | None,
    conversation_id: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
) -> list[dict[str, Any]]:
    """Newest first; `after` is the (created_at, id) of the last turn of the previous page."""
    q = select(turns)
    if statuses:
        q = q.where(turns.c.status.in_([s.value for s in statuses]))
    if agent:
        q = q.where(turns.c.agent_name == agent)
    if conversation_id:
        q = q.where(turns.c.conversation_id == conversation_id)
    if after:
        created, tid = after
        q = q.where(
            or_(turns.c.created_at < created, and_(turns.c.created_at == created, turns.c.id < tid))
        )
    q = q.order_by(turns.c.created_at.desc(), turns.c.id.desc()).limit(limit)
    return [dict(r) for r in session.execute(q).mappings()]


def message_from_row(r: Any) -> Message:
    meta = dict(r.meta or {})
    return Message(
        role=r.role,
        content=r.content,
        tool_calls=tuple(ToolCall.from_json(c) for c in (r.tool_calls or ())),
        tool_call_id=r.tool_call_id,
        name=r.name,
        message_id=meta.pop("message_id", None),
        meta=meta,
    )


def messages(session: Session, turn_id: str) -> list[dict[str, Any]]:
    q = (
        select(turn_messages)
        .where(turn_messages.c.turn_id == turn_id)
        .order_by(turn_messages.c.seq)
    )
    return [dict(r) for r in session.execute(q).mappings()]


_MESSAGE_FIELDS = (
    turn_messages.c.role,
    turn_messages.c.content,
    turn_messages.c.tool_calls,
    turn_messages.c.tool_call_id,
    turn_messages.c.name,
    turn_messages.c.meta,
)


def transcript(session: Session, turn_id: str) -> list[Message]:
    """The turn's own messages as domain objects, in order (read once per claim)."""
    q = (
        select(*_MESSAGE_FIELDS)
        .where(turn_messages.c.turn_id == turn_id)
        .order_by(turn_messages.c.seq)
    )
    return [message_from_row(r) for r in session.execute(q)]


def conversation_history(session: Session, conversation_id: str, before_turn: str) -> list[Message]:
    """Earlier turns' messages of a conversation (system prompts left out), oldest first."""
    q = (
        select(*_MESSAGE_FIELDS)
        .join(turns, turns.c.id == turn_messages.c.turn_id)
        .where(
            turn_messages.c.conversation_id == conversation_id,
            turn_messages.c.turn_id != before_turn,
            turn_messages.c.role != "system",
            turns.c.created_at
            <= select(turns.c.created_at).where(turns.c.id == before_turn).scalar_subquery(),
        )
        .order_by(turns.c.created_at, turns.c.id, turn_messages.c.seq)
    )
    return [message_from_row(r) for r in session.execute(q)]


def events(
    session: Session, turn_id: str, after: int = 0, limit: int = 1000
) -> list[dict[str, Any]]:
    q = (
        select(turn_events)
        .where(turn_events.c.turn_id == turn_id, turn_events.c.seq > after)
        .order_by(turn_events.c.seq)
        .limit(limit)
    )
    return [dict(r) for r in session.execute(q).mappings()]


def version_of(session: Session, turn_id: str) -> int | None:
    return session.execute(select(turns.c.version).where(turns.c.id == turn_id)).scalar()


def enqueue_user_message(session: Session, turn_id: str, message_id: str, content: str) -> None:
    """Queue a user message; the worker delivers it into the transcript before a model call.
    The turn row counts it, so the worker's next write learns of it without a query."""
    session.execute(
        insert(turn_inbox).values(
            turn_id=turn_id, message_id=message_id, content=content, created_at=utcnow()
        )
    )
    session.execute(
        update(turns).where(turns.c.id == turn_id).values(inbox_pending=turns.c.inbox_pending + 1)
    )


def undelivered_inbox(session: Session, turn_id: str) -> list[dict[str, Any]]:
    q = (
        select(turn_inbox)
        .where(turn_inbox.c.turn_id == turn_id, turn_inbox.c.delivered_at.is_(None))
        .order_by(turn_inbox.c.id)
    )
    return [dict(r) for r in session.execute(q).mappings()]


def active_in_conversation(session: Session, conversation_id: str) -> bool:
    """Whether the conversation has a turn that has not finished."""
    q = (
        select(turns.c.id)
        .where(
            turns.c.conversation_id == conversation_id,
            turns.c.status.not_in([s.value for s in TurnStatus if s.is_terminal]),
        )
        .limit(1)
    )
    return session.execute(q).first() is not None


def inbox_has(session: Session, turn_id: str, message_id: str) -> bool:
    """Whether a user message with this message_id was already taken for the turn."""
    q = select(turn_inbox.c.id).where(
        turn_inbox.c.turn_id == turn_id, turn_inbox.c.message_id == message_id
    )
    return session.execute(q).first() is not None
