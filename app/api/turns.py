"""Turns: create, read (with long-poll), list, transcript, event log (JSON or SSE)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from app import metrics
from app.api import views
from app.api.agents import get_spec
from app.api.auth import ClientAuth
from app.api.changes import ChangeFeed, wait_for
from app.api.deps import db_of, settings_of
from app.api.problems import Problem, not_found
from app.api.schemas import (
    MAX_INT32,
    CreateTurn,
    Event,
    EventList,
    MessageList,
    Turn,
    TurnList,
)
from app.domain.policy import resolve_policy
from app.domain.status import TurnStatus
from app.domain.transcript import Message
from app.store import turns as store
from app.store.db import Database
from app.store.notify import WAKE, notify
from app.store.types import utcnow

router = APIRouter(prefix="/v1/turns", tags=["turns"], dependencies=[ClientAuth])

MAX_WAIT_MS = 60_000
# Events per read; a JSON answer holds at most this many (`next_after` says when it is full).
EVENT_PAGE = 1000


def _request_hash(body: CreateTurn) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(session: Any, key: str, request_hash: str) -> dict[str, Any] | None:
    """The turn an Idempotency-Key already created, or 409 if the body differs."""
    found = store.find_idempotent(session, key)
    if found is None:
        return None
    if found["request_hash"] != request_hash:
        raise Problem(
            409, "idempotency_conflict", "this Idempotency-Key was used with a different body"
        )
    return store.get(session, found["turn_id"])


@router.post(
    "",
    status_code=201,
    response_model=Turn,
    responses={200: {"model": Turn, "description": "Replay of an Idempotency-Key"}},
)
def create_turn(
    body: CreateTurn,
    request: Request,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Any:
    """Create a turn in READY; the same Idempotency-Key with the same body returns the first."""
    db = db_of(request)
    request_hash = _request_hash(body)
    try:
        with db.transaction() as session:
            if idempotency_key:
                first = _replay(session, idempotency_key, request_hash)
                if first is not None:
                    return JSONResponse(jsonable_encoder(views.turn(first)), status_code=200)
            row = _new_turn(session, body, settings_of(request).default_execution_policy)
            if idempotency_key:
                store.save_idempotency_key(session, idempotency_key, request_hash, row["id"])
            notify(session, WAKE)
    except IntegrityError:
        # Lost a race: either the same key was just used, or the conversation got a live turn.
        with db.transaction() as session:
            if idempotency_key:
                first = _replay(session, idempotency_key, request_hash)
                if first is not None:
                    return JSONResponse(jsonable_encoder(views.turn(first)), status_code=200)
        raise _busy(body.conversation_id) from None
    metrics.turns_created.labels(body.agent).inc()
    return views.turn(row)


def _busy(conversation_id: str | None) -> Problem:
    return Problem(
        409,
        "conversation_busy",
        "the conversation already has a turn that has not finished",
        conversation_id=conversation_id,
    )


def _new_turn(session: Any, body: CreateTurn, server_default: Any) -> dict[str, Any]:
    spec, version = get_spec(session, body.agent, body.agent_version)
    if body.conversation_id and store.active_in_conversation(session, body.conversation_id):
        raise _busy(body.conversation_id)
    policy = resolve_policy(server_default, spec.execution_policy, body.execution_policy)
    now = utcnow()
    row: dict[str, Any] = {
        "id": "turn_" + uuid.uuid4().hex,
        "agent_name": body.agent,
        "agent_version": version,
        "conversation_id": body.conversation_id or "conv_" + uuid.uuid4().hex,
        "status": TurnStatus.READY.value,
        "created_at": now,
        "updated_at": now,
        "execution_policy": policy.model_dump(mode="json"),
        "pending_tool_calls": [],
        "metadata": body.metadata,
    }
    first: list[Message] = []
    if spec.system_prompt:
        first.append(Message(role="system", content=spec.system_prompt))
    first.append(Message(role="user", content=body.input))
    store.insert_turn(
        session,
        row,
        first,
        (
            "created",
            {
                "agent": body.agent,
                "agent_version": version,
                "policy_source": "turn"
                if body.execution_policy
                else "agent"
                if spec.execution_policy
                else "server",
            },
        ),
    )
    created = store.get(session, row["id"])
    assert created is not None
    return created


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, tid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:
            raise ValueError("cursor time without a zone")  # the store refuses naive times
        return at, str(tid)
    except (ValueError, TypeError) as e:
        raise Problem(
            422,
            "validation_error",
            "cursor: not a cursor this API issued",
            errors=[{"field": "query.cursor", "message": "invalid cursor"}],
        ) from e


def _encode_cursor(row: dict[str, Any]) -> str:
    raw = json.dumps([row["created_at"].isoformat(), row["id"]])
    return base64.urlsafe_b64encode(raw.encode()).decode()


@router.get("", response_model=TurnList)
def list_turns(
    request: Request,
    status: Annotated[list[TurnStatus] | None, Query()] = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    conversation_id: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> dict[str, Any]:
    """Turns, newest first, filtered; follow `next_cursor` for the next page."""
    after = _decode_cursor(cursor) if cursor else None
    with db_of(request).transaction() as session:
        rows = store.list_page(
            session,
            statuses=status,
            agent=agent,
            conversation_id=conversation_id,
            limit=limit + 1,
            after=after,
        )
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [views.turn(r) for r in rows],
        "next_cursor": _encode_cursor(rows[-1]) if more else None,
    }


def _read_turn(db: Database, turn_id: str) -> dict[str, Any]:
    with db.transaction() as session:
        row = store.get(session, turn_id)
    if row is None:
        raise not_found(f"turn {turn_id!r}")
    return row


@router.get("/{turn_id}", response_model=Turn)
async def get_turn(
    turn_id: str,
    request: Request,
    wait_ms: Annotated[int, Query(ge=0, le=MAX_WAIT_MS)] = 0,
    after_version: Annotated[int | None, Query(ge=0)] = None,
) -> dict[str, Any]:
    """A turn; with wait_ms and after_version, waits until its version exceeds after_version."""
    db = db_of(request)
    row = await run_in_threadpool(_read_turn, db, turn_id)
    if not wait_ms or after_version is None or row["version"] > after_version:
        return views.turn(row)
    feed: ChangeFeed = request.app.state.changes
    deadline = time.monotonic() + wait_ms / 1000
    async with feed.watch(turn_id) as changed:
        changed.set()  # re-read once: a change between the first read and the watch sent no hint
        while row["version"] <= after_version:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await wait_for(changed, left)
            changed.clear()
            row = await run_in_threadpool(_read_turn, db, turn_id)
    return views.turn(row)


@router.get("/{turn_id}/messages", response_model=MessageList)
def get_messages(turn_id: str, request: Request) -> dict[str, Any]:
    """The whole transcript in order."""
    with db_of(request).transaction() as session:
        if store.version_of(session, turn_id) is None:
            raise not_found(f"turn {turn_id!r}")
        return {"items": [views.message(m) for m in store.messages(session, turn_id)]}


def _read_events(
    db: Database, turn_id: str, after: int, limit: int
) -> tuple[list[dict[str, Any]], str]:
    with db.transaction() as session:
        row = store.get(session, turn_id)
        if row is None:
            raise not_found(f"turn {turn_id!r}")
        return store.events(session, turn_id, after, limit), row["status"]


def _last_event_id(value: str | None) -> int:
    """The seq an SSE client last received (its `Last-Event-ID`), 0 when absent or not a seq."""
    try:
        seq = int((value or "").strip())
    except ValueError:
        return 0
    return seq if 0 <= seq <= MAX_INT32 else 0


@router.get(
    "/{turn_id}/events",
    response_model=EventList,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def get_events(
    turn_id: str,
    request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
    last_event_id: Annotated[
        str | None,
        Header(
            description="With `Accept: text/event-stream`: the id of the last event a "
            "reconnecting client received; the stream starts after the larger of it and "
            "`after`. Ignored when not a sequence number.",
        ),
    ] = None,
) -> Any:
    """The event log after `after`, at most 1000 events an answer: when a page is full,
    `next_after` is its last `seq` (ask again with `after` set to it); else it is null.
    With `Accept: text/event-stream`, all of it streamed until the turn is terminal, starting
    after `Last-Event-ID` when a reconnecting client sends one."""
    db = db_of(request)
    stream = "text/event-stream" in request.headers.get("accept", "")
    if stream:
        after = max(after, _last_event_id(last_event_id))
    page = EVENT_PAGE
    items, status = await run_in_threadpool(_read_events, db, turn_id, after, page)
    if not stream:
        full = len(items) >= page
        return {
            "items": [views.event(e) for e in items],
            "next_after": items[-1]["seq"] if full and items else None,
        }
    return StreamingResponse(
        _stream(request, db, turn_id, items, status, after, page),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(
    request: Request,
    db: Database,
    turn_id: str,
    items: list[dict[str, Any]],
    status: str,
    after: int,
    page: int,
) -> AsyncIterator[str]:
    feed: ChangeFeed = request.app.state.changes
    last = after
    async with feed.watch(turn_id) as changed:
        changed.set()  # re-read once: a change between the first read and the watch sent no hint
        while True:
            for e in items:
                last = e["seq"]
                data = Event.model_validate(views.event(e)).model_dump_json()  # as in JSON
                yield f"id: {last}\nevent: {e['type']}\ndata: {data}\n\n"
            # A full page means more are already there: read on before stopping or waiting.
            if len(items) < page:
                if TurnStatus(status).is_terminal or await request.is_disconnected():
                    return
                await wait_for(changed, 15.0)
                if not changed.is_set():
                    yield ": keep-alive\n\n"
                changed.clear()
            items, status = await run_in_threadpool(_read_events, db, turn_id, last, page)
