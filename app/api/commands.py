"""Turn commands: resume (generic), retry, retry-model, messages, tool-results, cancel.

Each command reads the turn, checks its preconditions, builds one TurnUpdate and applies it
fenced by the version it read; a concurrent writer makes the fence miss and the command is
re-read and re-checked, so no update is lost. Status changes here only ever touch a turn no
worker holds; for a held turn a command only raises a flag or queues a message."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from sqlalchemy.orm import Session

from app import metrics
from app.api import views
from app.api.auth import ClientAuth, Role, request_role
from app.api.deps import db_of
from app.api.problems import Problem, invalid_state, not_found
from app.api.schemas import (
    CancelBody,
    Command,
    ResumeBody,
    RetryBody,
    RetryModelBody,
    ToolError,
    ToolResultBody,
    Turn,
    UserMessageBody,
)
from app.domain.agent import ModelSpec
from app.domain.failures import ErrorClass, Failure, sanitize
from app.domain.policy import ExecutionPolicy, ToolErrorStrategy
from app.domain.status import TurnEvent, TurnStatus
from app.domain.transcript import (
    INTERRUPTED_BY_USER,
    Message,
    ToolCall,
    closing_messages,
    interrupted_tool_messages,
    tool_error_result,
)
from app.domain.update import TurnUpdate
from app.store import agents as agents_store
from app.store import turns as store
from app.store.db import Database
from app.store.notify import CANCEL, CHANGED, WAKE, notify
from app.store.writer import Fence, apply_update

router = APIRouter(prefix="/v1/turns", tags=["commands"], dependencies=[ClientAuth])

# Builds the update for a turn row, or raises a Problem; may return None for "nothing to
# change" (an idempotent repeat). The second item runs after a successful fenced write.
Plan = Callable[[Session, dict[str, Any]], tuple[TurnUpdate | None, Callable[[], None] | None]]

MAX_ATTEMPTS = 20


def _held(row: dict[str, Any]) -> bool:
    expires = row["lease_expires_at"]
    return expires is not None and expires > datetime.now(UTC)


def _require(row: dict[str, Any], *allowed: TurnStatus) -> TurnStatus:
    status = TurnStatus(row["status"])
    if status.is_terminal:
        raise _finished(status)
    if status not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise invalid_state(
            status.value, f"this command needs the turn in {names}, not {status.value}"
        )
    if _held(row) and status is not TurnStatus.RUNNING:
        raise invalid_state(status.value, "a worker is resuming this turn right now")
    return status


def _finished(status: TurnStatus) -> Problem:
    return Problem(
        409, "turn_finished", f"the turn has finished ({status.value})", turn_status=status.value
    )


def _run(db: Database, turn_id: str, command: str, plan: Plan) -> dict[str, Any]:
    """Apply a command with optimistic concurrency; returns the turn as it is afterwards."""
    try:
        for _ in range(MAX_ATTEMPTS):
            with db.transaction() as session:
                row = store.get(session, turn_id)
                if row is None:
                    raise not_found(f"turn {turn_id!r}")
                upd, after = plan(session, row)
                if upd is not None:
                    upd.event("command", {"command": command})
                    fence = Fence(version=row["version"], unleased=not _held(row))
                    applied = apply_update(session, turn_id, fence, upd)
                    if not applied.ok:
                        continue  # someone wrote first: read again, check again
                    if after is not None:
                        after()
                    notify(session, CHANGED, turn_id)
                    if upd.status is TurnStatus.RUNNING and not _held(row):
                        notify(session, WAKE)
                    row = store.get(session, turn_id)
                    assert row is not None
            metrics.commands.labels(command, "accepted").inc()
            return views.turn(row)
        raise Problem(409, "invalid_state", "the turn kept changing; try again")
    except Problem as p:
        metrics.commands.labels(command, p.code).inc()
        raise


def _update(row: dict[str, Any], *, reset: bool = True) -> TurnUpdate:
    upd = TurnUpdate(TurnStatus(row["status"]))
    upd.values["steps"] = row["steps"] + 1  # a command applied is a step (RUNNER.md)
    if reset:
        upd.values["consecutive_retry_count"] = 0
    return upd


# ---- plans ---------------------------------------------------------------------------------


def _retry_plan(force: bool) -> Plan:
    def plan(_: Session, row: dict[str, Any]) -> tuple[TurnUpdate, None]:
        _require(row, TurnStatus.RETRY_SCHEDULED)
        due = row["next_runnable_at"]
        now = datetime.now(UTC)
        if not force and due is not None and due > now:
            raise Problem(
                409,
                "not_due",
                "the retry is not due yet",
                next_runnable_at=due.isoformat().replace("+00:00", "Z"),
                turn_status=row["status"],
            )
        # RETRY keeps the consecutive count, so a lasting fault cannot retry forever.
        upd = _update(row, reset=False)
        upd.move(
            TurnEvent.CONTINUE if force else TurnEvent.RETRY,
            "resumed now (force)" if force else "retry due",
        )
        upd.event("retry_resumed", {"by": "api", "force": force})
        return upd, None

    return plan


# What a model call is sent to and with which secret: a client token may change anything of
# the model but these (API.md, Auth: switching where a turn's requests go is an admin's call).
ENDPOINT_FIELDS = ("provider", "base_url", "api_key_env")


def _current_model(session: Session, row: dict[str, Any]) -> dict[str, Any]:
    """The model the turn uses now: its override, else its agent version's model."""
    if row["model_override"]:
        return dict(row["model_override"])
    agent = agents_store.get(session, row["agent_name"], row["agent_version"])
    return dict((agent or {}).get("spec", {}).get("model") or {})


def _check_model_switch(session: Session, row: dict[str, Any], model: ModelSpec) -> None:
    """A client token may switch only to a model on the turn's current endpoint and key."""
    current = _current_model(session, row)
    wanted = model.model_dump(mode="json")
    changed = [f for f in ENDPOINT_FIELDS if wanted.get(f) != current.get(f)]
    if changed:
        raise Problem(
            403,
            "forbidden",
            "a client token may switch the model only on the turn's current provider, "
            f"base_url and api_key_env; changing {', '.join(changed)} needs an admin token",
            fields=changed,
        )


def _retry_model_plan(failure_id: str, model: ModelSpec | None, admin: bool) -> Plan:
    def plan(session: Session, row: dict[str, Any]) -> tuple[TurnUpdate, None]:
        _require(row, TurnStatus.WAITING_FOR_MODEL)
        current = (row["last_error"] or {}).get("failure_id")
        if failure_id != current:
            raise Problem(
                409,
                "stale_failure",
                "failure_id is not the turn's last failure",
                failure_id=current,
                turn_status=row["status"],
            )
        if model is not None and not admin:
            _check_model_switch(session, row, model)
        upd = _update(row)
        if model is not None:
            upd.values["model_override"] = model.model_dump(mode="json")
        upd.move(
            TurnEvent.RETRY_MODEL,
            f"retry-model ({model.model})" if model is not None else "retry-model",
        )
        return upd, None

    return plan


def _message_plan(content: str, message_id: str | None) -> Plan:
    mid = message_id or "msg_" + uuid.uuid4().hex

    def plan(session: Session, row: dict[str, Any]) -> tuple[TurnUpdate | None, Any]:
        status = TurnStatus(row["status"])
        if status.is_terminal:
            raise _finished(status)
        if store.inbox_has(session, row["id"], mid):
            return None, None  # the same message_id again: accepted once only
        upd = _update(row)
        upd.event("user_message", {"message_id": mid})
        queue_only = status in (TurnStatus.READY, TurnStatus.RUNNING) or _held(row)
        if not queue_only:
            # The turn calls the model next, so no tool call may stay open: the external calls
            # of WAITING_FOR_TOOL, and a failed tool call whose retry was scheduled (FAIL_RUN),
            # are closed as interrupted. The turn goes on, so no closing assistant message.
            policy = ExecutionPolicy.model_validate(row["execution_policy"])
            transcript = store.transcript(session, row["id"])
            for m in interrupted_tool_messages(transcript, policy, INTERRUPTED_BY_USER):
                upd.message(m)
            upd.move(TurnEvent.USER_MESSAGE, "new user message")

        def queue() -> None:
            store.enqueue_user_message(session, row["id"], mid, content)

        return upd, queue

    return plan


def _tool_result_plan(body: ToolResultBody) -> Plan:
    def plan(session: Session, row: dict[str, Any]) -> tuple[TurnUpdate, Any]:
        _require(row, TurnStatus.WAITING_FOR_TOOL)
        pending = [ToolCall.from_json(c) for c in row["pending_tool_calls"] or []]
        call = next((c for c in pending if c.id == body.tool_call_id), None)
        if call is None:
            raise invalid_state(row["status"], f"tool call {body.tool_call_id!r} is not pending")
        upd = _update(row)
        upd.values["tool_calls"] = row["tool_calls"] + 1
        policy = ExecutionPolicy.model_validate(row["execution_policy"])
        if body.error is not None:
            upd.event("tool_result", {"tool_call_id": call.id, "error": True})
            if policy.tool_error_strategy is ToolErrorStrategy.FAIL_RUN:
                return upd, _fail_on_tool_error(session, row, upd, policy, body.error)
            upd.message(
                tool_error_result(policy, call, body.error.code, sanitize(body.error.message))
            )
        else:
            upd.event("tool_result", {"tool_call_id": call.id, "error": False})
            text = body.content if isinstance(body.content, str) else json.dumps(body.content)
            upd.message(Message(role="tool", content=text, tool_call_id=call.id, name=call.name))
        rest = [c.to_json() for c in pending if c.id != call.id]
        upd.values["pending_tool_calls"] = rest
        if not rest:
            upd.move(TurnEvent.TOOL_RESULTS_IN, "all tool results in")
        return upd, None

    return plan


def _fail_on_tool_error(
    session: Session,
    row: dict[str, Any],
    upd: TurnUpdate,
    policy: ExecutionPolicy,
    error: ToolError,
) -> Callable[[], None]:
    """FAIL_RUN: an external tool's error fails the turn, as a failing tool the runner ran
    would (RUNNER.md): no retry (the service cannot run an external tool again), the transcript
    closed once (every call without a result, this one included, then the closing message)."""
    failure = Failure.of(ErrorClass.TOOL_FAILED, error.message, code=error.code)
    reason = f"tool_failed (external tool reported {error.code}): {failure.message}"
    upd.values["last_error"] = failure.to_json()
    for m in closing_messages(store.transcript(session, row["id"]), policy, reason):
        upd.message(m)
    # The table has RUNNING -> FAILED for a tool failure: the error is in (the turn runs on
    # for this one update) and fails it at once, both moves in the same write.
    upd.move(TurnEvent.TOOL_RESULTS_IN, "external tool reported an error")
    upd.move(TurnEvent.FAIL, reason)

    def count() -> None:  # once the write is in, not per attempt
        metrics.errors.labels(failure.source.value, failure.error_class.value).inc()

    return count


def _cancel_plan(reason: str | None) -> Plan:
    def plan(session: Session, row: dict[str, Any]) -> tuple[TurnUpdate | None, None]:
        status = TurnStatus(row["status"])
        if status is TurnStatus.CANCELLED:
            return None, None  # cancelling a cancelled turn answers it again
        if status.is_terminal:
            raise _finished(status)
        policy = ExecutionPolicy.model_validate(row["execution_policy"])
        why = reason or policy.cancellation_reason
        upd = _update(row)  # a command like the others: a step, and the consecutive count reset
        upd.values.update(cancel_requested=True, cancel_reason=why)
        if _held(row):
            # The worker holding it aborts its call and closes the transcript (within 1 s).
            upd.event("cancel_requested", {"reason": why})
            notify(session, CANCEL, row["id"])
            return upd, None
        for m in closing_messages(store.transcript(session, row["id"]), policy, why):
            upd.message(m)
        upd.event("cancelled", {"reason": why})
        upd.move(TurnEvent.CANCEL, why)
        return upd, None

    return plan


# ---- routes --------------------------------------------------------------------------------

Accepted = {"status_code": 202, "response_model": Turn}


@router.post("/{turn_id}/retry", **Accepted)  # type: ignore[arg-type]
def retry(
    turn_id: str, request: Request, body: Annotated[RetryBody | None, Body()] = None
) -> dict[str, Any]:
    """RETRY a due RETRY_SCHEDULED turn; `force` (admin) resumes it now (CONTINUE)."""
    force = bool(body and body.force)
    if force:
        _require_admin(request)
    return _run(db_of(request), turn_id, "CONTINUE" if force else "RETRY", _retry_plan(force))


@router.post("/{turn_id}/retry-model", **Accepted)  # type: ignore[arg-type]
def retry_model(turn_id: str, body: RetryModelBody, request: Request) -> dict[str, Any]:
    """RETRY_MODEL a WAITING_FOR_MODEL turn, optionally on another model."""
    plan = _retry_model_plan(body.failure_id, body.model, _is_admin(request))
    return _run(db_of(request), turn_id, "RETRY_MODEL", plan)


@router.post("/{turn_id}/messages", **Accepted)  # type: ignore[arg-type]
def post_message(turn_id: str, body: UserMessageBody, request: Request) -> dict[str, Any]:
    """A user message into the turn (queued, or resuming a waiting turn)."""
    return _run(
        db_of(request), turn_id, "USER_MESSAGE", _message_plan(body.content, body.message_id)
    )


@router.post("/{turn_id}/tool-results", **Accepted)  # type: ignore[arg-type]
def tool_results(turn_id: str, body: ToolResultBody, request: Request) -> dict[str, Any]:
    """The result (or error) of a pending external tool call."""
    command = "TOOL_ERROR" if body.error is not None else "TOOL_RESULT"
    return _run(db_of(request), turn_id, command, _tool_result_plan(body))


@router.post("/{turn_id}/cancel", **Accepted)  # type: ignore[arg-type]
def cancel(
    turn_id: str, request: Request, body: Annotated[CancelBody | None, Body()] = None
) -> dict[str, Any]:
    """Cancel: at once if no worker holds the turn, else the worker aborts within 1 s."""
    return _run(db_of(request), turn_id, "CANCEL", _cancel_plan(body.reason if body else None))


@router.post("/{turn_id}/resume", **Accepted)  # type: ignore[arg-type]
def resume(turn_id: str, body: ResumeBody, request: Request) -> dict[str, Any]:
    """The generic command form: `command` plus the fields of the matching shortcut."""
    db = db_of(request)
    c = body.command
    if c in (Command.RETRY, Command.CONTINUE):
        if c is Command.CONTINUE:
            _require_admin(request)
        return _run(db, turn_id, c.value, _retry_plan(c is Command.CONTINUE))
    if c is Command.RETRY_MODEL:
        if not body.failure_id:
            raise _missing("failure_id")
        plan = _retry_model_plan(body.failure_id, body.model, _is_admin(request))
        return _run(db, turn_id, c.value, plan)
    if c is Command.USER_MESSAGE:
        if not isinstance(body.content, str):
            raise _missing("content", "a string")
        return _run(db, turn_id, c.value, _message_plan(body.content, body.message_id))
    if not body.tool_call_id:
        raise _missing("tool_call_id")
    if c is Command.TOOL_ERROR and body.error is None:
        raise _missing("error")
    if c is Command.TOOL_RESULT and body.content is None:
        raise _missing("content")
    result = ToolResultBody(
        tool_call_id=body.tool_call_id,
        content=body.content if c is Command.TOOL_RESULT else None,
        error=body.error if c is Command.TOOL_ERROR else None,
    )
    return _run(db, turn_id, c.value, _tool_result_plan(result))


def _missing(field: str, what: str = "required") -> Problem:
    return Problem(
        422,
        "validation_error",
        f"body.{field}: {what} for this command",
        errors=[{"field": f"body.{field}", "message": what}],
    )


def _is_admin(request: Request) -> bool:
    return request_role(request) is Role.ADMIN


def _require_admin(request: Request) -> None:
    if not _is_admin(request):
        raise Problem(403, "forbidden", "force needs an admin token")
