"""The step writer seam: apply TurnUpdates, fenced, many turns per transaction (group commit).

A write is fenced either by the worker's lease token (a worker that lost its claim changes
nothing) or by the version the caller read (a command racing another writer changes nothing
and is retried by its caller). Sequence numbers of appended rows come from the same UPDATE that
locks the turn row, so rows of one turn are numbered in commit order."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from app.domain.status import TurnEvent
from app.domain.transcript import Message
from app.domain.update import TurnUpdate
from app.store.tables import turn_events, turn_inbox, turn_messages, turns
from app.store.types import utcnow


@dataclass(frozen=True)
class Fence:
    """What a write must still match: the lease token it holds, or the version it read."""

    lease_token: str | None = None
    version: int | None = None
    # The turn must still be free of any worker's lease (a command that read it unheld and
    # changes its status must not race a claim that happened since).
    unleased: bool = False


@dataclass(frozen=True)
class Applied:
    """What the database says after a write; `ok` False means the fence did not match."""

    ok: bool
    version: int = 0
    cancel_requested: bool = False
    cancel_reason: str | None = None
    inbox_pending: int = 0
    # The counters as they are after the write (commands may have added to them meanwhile).
    counters: dict[str, int] = field(default_factory=dict)
    # The update's `if_inbox` alternative was written: user messages were waiting.
    took_inbox_branch: bool = False


FENCED_OUT = Applied(ok=False)

COUNTERS = (
    "iterations",
    "steps",
    "tool_calls",
    "model_attempts",
    "input_tokens",
    "output_tokens",
    "retry_count",
    "consecutive_retry_count",
)


def storable(value: Any) -> Any:
    """`value` with NUL characters replaced: PostgreSQL text and JSONB refuse them, and a tool or
    model may well send one."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def message_row(
    turn_id: str, conversation_id: str, seq: int, m: Message, now: Any
) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "seq": seq,
        "conversation_id": conversation_id,
        "role": m.role,
        "content": storable(m.content),
        "tool_calls": storable([c.to_json() for c in m.tool_calls]) if m.tool_calls else None,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
        "meta": ({**m.meta, "message_id": m.message_id} if m.message_id else m.meta) or None,
        "created_at": now,
    }


def apply_updates(session: Session, writes: list[tuple[str, Fence, TurnUpdate]]) -> list[Applied]:
    """Apply each turn's update in the caller's transaction; one Applied per write, in order.

    A constant number of round trips per batch, whatever its size: lock and read every turn
    of the batch in one SELECT … FOR UPDATE, check the fences in Python, then write with one
    executemany per statement shape (psycopg pipelines those)."""
    if not writes:
        return []
    now = utcnow()
    ids = [turn_id for turn_id, _, _ in writes]
    current = {
        r.id: dict(r._mapping)
        for r in session.execute(
            select(
                turns.c.id,
                turns.c.version,
                turns.c.lease_token,
                turns.c.lease_expires_at,
                turns.c.message_count,
                turns.c.event_count,
                turns.c.cancel_requested,
                turns.c.cancel_reason,
                turns.c.inbox_pending,
                turns.c.next_runnable_at,
                turns.c.conversation_id,
                turns.c.agent_name,
                *(turns.c[name] for name in COUNTERS),
            )
            .where(turns.c.id.in_(ids))
            .with_for_update()
        )
    }
    results: list[Applied] = []
    by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    message_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    delivered: list[int] = []
    for turn_id, fence, upd in writes:
        row = current.get(turn_id)
        if row is None or not _matches(fence, row, now):
            results.append(FENCED_OUT)
            continue
        branch = upd.if_inbox is not None and row["inbox_pending"] > len(upd.delivered_inbox)
        if branch:
            assert upd.if_inbox is not None
            upd = upd.if_inbox
        counters = {name: row[name] + upd.increments.get(name, 0) for name in COUNTERS}
        counters.update((k, v) for k, v in upd.values.items() if k in counters)
        first_message, first_event = row["message_count"] + 1, row["event_count"] + 1
        message_count = row["message_count"] + len(upd.messages)
        event_count = row["event_count"] + len(upd.events)
        inbox_pending = row["inbox_pending"] - len(upd.delivered_inbox)
        version = row["version"] + 1
        values = {
            **storable(upd.values),
            **counters,
            "updated_at": now,
            "version": version,
            "message_count": message_count,
            "event_count": event_count,
            "inbox_pending": inbox_pending,
        }
        if upd.release_lease:
            values.update(lease_owner=None, lease_token=None, lease_expires_at=None)
        by_shape[tuple(sorted(values))].append({**values, "b_id": turn_id})
        # Rows that follow in the same batch see this write (a turn may appear twice).
        row.update(
            counters,
            version=version,
            message_count=message_count,
            event_count=event_count,
            inbox_pending=inbox_pending,
        )
        if upd.release_lease:
            row["lease_token"] = None
        message_rows.extend(
            message_row(turn_id, row["conversation_id"], first_message + i, m, now)
            for i, m in enumerate(upd.messages)
        )
        event_rows.extend(
            {
                "turn_id": turn_id,
                "seq": first_event + i,
                "type": t,
                "data": storable(d),
                "created_at": now,
            }
            for i, (t, d) in enumerate(upd.events)
        )
        delivered.extend(upd.delivered_inbox)
        _record_moves(session, upd, row, now)
        results.append(
            Applied(
                True,
                version,
                row["cancel_requested"],
                row["cancel_reason"],
                inbox_pending,
                counters,
                branch,
            )
        )
    for params in by_shape.values():
        session.execute(_UPDATE_BY_ID, params)
    if message_rows:
        session.execute(insert(turn_messages), message_rows)
    if event_rows:
        session.execute(insert(turn_events), event_rows)
    if delivered:
        session.execute(
            update(turn_inbox).where(turn_inbox.c.id.in_(delivered)).values(delivered_at=now)
        )
    return results


def _record_moves(session: Session, upd: TurnUpdate, row: dict[str, Any], now: datetime) -> None:
    """What the moves mean for the metrics, counted once the transaction commits
    (app.store.notify), not if it rolls back: finishes, and how late a retry resumed."""
    for _, after, event in upd.moves:
        if after.is_terminal:
            session.info.setdefault("turnrunner_finished", []).append(
                (row["agent_name"], after.value)
            )
        if event is TurnEvent.RETRY and row["next_runnable_at"] is not None:
            lag = max(0.0, (now - row["next_runnable_at"]).total_seconds())
            session.info.setdefault("turnrunner_retry_lag", []).append(lag)


# The SET clause comes from the keys of the parameters (all alike within one executemany).
_UPDATE_BY_ID = update(turns).where(turns.c.id == bindparam("b_id"))


def _matches(fence: Fence, row: dict[str, Any], now: datetime) -> bool:
    if fence.lease_token is not None and row["lease_token"] != fence.lease_token:
        return False
    held = row["lease_expires_at"] is not None and row["lease_expires_at"] > now
    if fence.unleased and held:
        return False
    return fence.version is None or row["version"] == fence.version


def apply_update(session: Session, turn_id: str, fence: Fence, upd: TurnUpdate) -> Applied:
    """One turn's update; see apply_updates."""
    return apply_updates(session, [(turn_id, fence, upd)])[0]
