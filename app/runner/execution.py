"""Driving one claimed turn: model call → tool calls → model call …, one durable step at a time.

Every step builds a TurnUpdate and commits it through the step writer before the next step
begins; the transcript lives in memory while we hold the lease, so a step never re-reads it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from app import metrics
from app.domain import limits
from app.domain.agent import AgentSpec, ModelSpec, ToolKind
from app.domain.backoff import retry_delay
from app.domain.failures import ErrorClass, Failure, FailureError, Source
from app.domain.limits import Counters, LimitTrip
from app.domain.policy import ExecutionPolicy, ToolErrorStrategy
from app.domain.status import TurnEvent, TurnStatus
from app.domain.transcript import (
    INTERRUPTED_BY_USER,
    Message,
    ToolCall,
    closing_messages,
    interrupted_tool_messages,
    tool_error_result,
    unique_tool_call_ids,
    unresolved_tool_calls,
)
from app.domain.update import TurnUpdate
from app.models.base import ModelProvider, ModelRequest
from app.models.registry import ModelRegistry
from app.runner.step_writer import StepWriter
from app.store import turns as turns_store
from app.store.db import Database
from app.store.writer import COUNTERS
from app.tools.base import ToolContext
from app.tools.execute import ToolRunner

log = logging.getLogger("turnrunner.runner")
_MS = timedelta(milliseconds=1)

DEFAULT_MODEL_TIMEOUT_MS = 120_000
# Tool errors that happen after a real execution started (the others never ran anything).
_EXECUTED = {ErrorClass.TOOL_TIMEOUT, ErrorClass.TOOL_UNAVAILABLE, ErrorClass.TOOL_FAILED}


class LeaseLost(Exception):
    """Our write was fenced out: another worker owns the turn now; stop touching it."""


class CallCancelled(Exception):
    """The in-flight model or tool call was aborted because the turn was cancelled."""


@dataclass(frozen=True)
class Loaded:
    """What a worker reads once when it claims a turn."""

    row: dict[str, Any]
    agent: AgentSpec
    messages: list[Message]
    history: list[Message]
    inbox: list[dict[str, Any]]


class Runtime:
    """What the executions of one worker share: providers, tools, the step writer."""

    def __init__(
        self, db: Database, writer: StepWriter, tools: ToolRunner, models: ModelRegistry, owner: str
    ) -> None:
        self.db = db
        self.writer = writer
        self.tools = tools
        self.models = models
        self.owner = owner

    def provider(self, spec: ModelSpec) -> ModelProvider:
        return self.models.get(spec)

    async def load_inbox(self, turn_id: str) -> list[dict[str, Any]]:
        def load() -> list[dict[str, Any]]:
            with self.db.transaction() as session:
                return turns_store.undelivered_inbox(session, turn_id)

        return await asyncio.to_thread(load)

    async def load_cancel_reason(self, turn_id: str) -> str | None:
        def load() -> str | None:
            with self.db.transaction() as session:
                row = turns_store.get(session, turn_id)
                return row["cancel_reason"] if row else None

        return await asyncio.to_thread(load)


class TurnExecution:
    def __init__(self, loaded: Loaded, runtime: Runtime) -> None:
        row = loaded.row
        self.rt = runtime
        self.turn_id: str = row["id"]
        self.token: str = row["lease_token"]
        self.agent = loaded.agent
        self.agent_label = row["agent_name"]
        self.status = TurnStatus(row["status"])
        self.row = row
        self.policy = ExecutionPolicy.model_validate(row["execution_policy"])
        self.model_spec = (
            ModelSpec.model_validate(row["model_override"])
            if row["model_override"]
            else loaded.agent.model
        )
        self.messages = list(loaded.messages)
        # What the model sees: the system prompt, earlier turns of the conversation, this
        # turn; kept up to date on append so a step never rebuilds it from the transcript.
        self.context = (
            [m for m in self.messages if m.role == "system"]
            + loaded.history
            + [m for m in self.messages if m.role != "system"]
        )
        self.inbox = loaded.inbox
        self.taken_ids = {c.id for m in self.messages for c in m.tool_calls}
        self.created_at: datetime = row["created_at"]
        # Our view of the turn's counters; the database's after every commit (commands add to
        # them too), ours in between. Written as increments, never as absolute values.
        self.counts: dict[str, int] = {name: row[name] for name in COUNTERS}
        self.cancel_requested: bool = row["cancel_requested"]
        self.cancel_reason: str | None = row["cancel_reason"]
        self.inbox_pending: int = row["inbox_pending"]
        self.stopping = False
        # Set when a finish or a park gave way to queued user messages: the open tool calls
        # are closed as interrupted and the model answers the messages.
        self.answer_inbox = False
        self._inflight: asyncio.Task[Any] | None = None

    # ---- signals from the worker -------------------------------------------------------

    def request_cancel(self, reason: str | None = None) -> None:
        """The turn's cancel was requested: abort the call in flight and finalize."""
        self.cancel_requested = True
        self.cancel_reason = reason or self.cancel_reason
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()

    def stop(self) -> None:
        """Graceful shutdown: finish the step in flight, then hand the turn back."""
        self.stopping = True

    # ---- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            upd = self._start()
            if "status" in upd.values:
                # The claim moved the turn to RUNNING: make that visible before a model or tool
                # call that may take long, or the turn would look READY/RETRY_SCHEDULED while
                # it is being worked on.
                await self._commit(upd)
                upd = TurnUpdate(self.status)
            await self._loop(upd)
        except LeaseLost:
            log.warning(
                "lease lost; another worker owns the turn now", extra={"turn_id": self.turn_id}
            )
        except (OperationalError, InterfaceError):
            # The database is away: the step in flight is lost, not the turn. Its lease runs
            # out and a worker claims it again once the database is back.
            log.warning(
                "database unavailable; the turn will be claimed again",
                extra={"turn_id": self.turn_id},
                exc_info=True,
            )
        except Exception as exc:  # a bug or a dead database: fail the turn if we still can
            log.exception("runner error", extra={"turn_id": self.turn_id})
            await self._fail_internal(exc)

    def _start(self) -> TurnUpdate:
        upd = TurnUpdate(self.status)
        now = datetime.now(UTC)
        if self.row["started_at"] is None:
            upd.values["started_at"] = now
        if self.cancel_requested:
            return upd
        if self.status is TurnStatus.READY:
            upd.move(TurnEvent.CLAIM)
        elif self.status is TurnStatus.RETRY_SCHEDULED:
            lag = now - (self.row["next_runnable_at"] or now)
            upd.move(TurnEvent.RETRY, "retry due")
            upd.event("retry_resumed", {"by": "scheduler", "lag_ms": max(0, lag // _MS)})
        elif self.status is TurnStatus.RUNNING:
            upd.event("claimed", {"worker": self.rt.owner})
        self.status = upd.status
        return upd

    async def _loop(self, upd: TurnUpdate) -> None:
        while True:
            if self.cancel_requested:
                return await self._end(upd, TurnEvent.CANCEL, await self._cancel_reason())
            if self.status is not TurnStatus.RUNNING:
                # Claimed only to finish a cancel; nothing else to do in a waiting status.
                return await self._commit_and_release(upd)
            if self.stopping:
                return await self._commit_and_release(upd)
            trip = limits.before_step(self.policy, self._counters())
            if trip:
                return await self._end(upd, trip.event, trip.reason)
            try:
                done = await self._step(upd)
            except CallCancelled:
                # `upd` keeps what the step had done (a delivered message, the attempt).
                return await self._end(upd, TurnEvent.CANCEL, await self._cancel_reason())
            if done:
                return
            upd = TurnUpdate(self.status)

    async def _step(self, upd: TurnUpdate) -> bool:
        """One step; True when the turn stopped running (finished, parked or waiting)."""
        open_calls = unresolved_tool_calls(self.messages)
        if open_calls and self.answer_inbox:
            # A user message came while we were finishing or parking: like a message in a
            # waiting status, it closes the open calls and goes to the model.
            for m in interrupted_tool_messages(self.messages, self.policy, INTERRUPTED_BY_USER):
                self._append(upd, m)
            open_calls = []
        if not open_calls:
            self.answer_inbox = False
            return await self._model_step(upd)
        internal = [c for c in open_calls if not self._is_external(c)]
        if internal:
            return await self._tool_step(upd, internal[0])
        trip = limits.before_external_tool_calls(self.policy, self._counters(), len(open_calls))
        if trip:
            await self._end(upd, trip.event, trip.reason)
            return True
        alt = upd.fork()
        upd.values["pending_tool_calls"] = [c.to_json() for c in open_calls]
        reason = f"waiting for {len(open_calls)} external tool call(s)"
        return await self._stop(upd, alt, TurnEvent.WAIT_FOR_TOOL, reason)

    def _is_external(self, call: ToolCall) -> bool:
        spec = self.agent.tool(call.name)
        return spec is not None and spec.kind is ToolKind.EXTERNAL

    # ---- model -------------------------------------------------------------------------

    async def _model_step(self, upd: TurnUpdate) -> bool:
        if self.inbox_pending or self.inbox:
            await self._deliver_inbox(upd)
        trip = limits.before_model_call(self.policy, self._counters()) or self._duration_trip()
        if trip:
            await self._end(upd, trip.event, trip.reason)
            return True
        spec = self.model_spec
        timeout_s = self._cut_to_budget(spec.timeout_ms or DEFAULT_MODEL_TIMEOUT_MS)
        request = ModelRequest(
            spec=spec,
            messages=list(self.context),
            tools=list(self.agent.tools),
            call_index=self.counts["model_attempts"],
            timeout_s=timeout_s,
            turn_id=self.turn_id,
        )
        self._add(upd, "steps")
        self._add(upd, "model_attempts")
        attempt: dict[str, Any] = {"attempt": self.counts["model_attempts"], "model": spec.model}
        started = time.monotonic()
        failure: Failure | None = None
        try:
            reply = await self._call(
                self.rt.provider(spec).complete(request), timeout_s, ErrorClass.TIMEOUT
            )
        except FailureError as e:
            failure = e.failure
        except CallCancelled:
            upd.event("model_attempt", {**attempt, **_took(started), "outcome": "cancelled"})
            raise
        attempt.update(_took(started))
        metrics.model_call_duration.labels(spec.model).observe(time.monotonic() - started)
        metrics.model_calls.labels(spec.model, failure.error_class.value if failure else "ok").inc()
        if failure:
            upd.event("model_attempt", {**attempt, "outcome": "error", **_failure_fields(failure)})
            if await self._ended_by_duration(upd, failure):
                return True
            return await self._on_failure(upd, failure)
        self._add(upd, "iterations")
        self._reset_retries(upd)
        self._add(upd, "input_tokens", reply.input_tokens)
        self._add(upd, "output_tokens", reply.output_tokens)
        metrics.tokens.labels(spec.model, "input").inc(reply.input_tokens)
        metrics.tokens.labels(spec.model, "output").inc(reply.output_tokens)
        calls = unique_tool_call_ids(reply.tool_calls, self.taken_ids)
        upd.event(
            "model_attempt",
            {
                **attempt,
                "outcome": "ok",
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "tool_calls": len(calls),
            },
        )
        self._append(upd, Message(role="assistant", content=reply.content, tool_calls=tuple(calls)))
        trip = limits.after_model_answer(self.policy, self._counters())
        if trip:
            await self._end(upd, trip.event, trip.reason)
            return True
        if not calls:
            alt = upd.fork()
            upd.values["output"] = reply.content
            upd.values["last_error"] = None
            return await self._stop(upd, alt, TurnEvent.COMPLETE)
        upd.move(TurnEvent.TOOL_CALLS, f"{len(calls)} tool call(s)")
        await self._commit(upd)
        return False

    async def _deliver_inbox(self, upd: TurnUpdate) -> None:
        rows = self.inbox or await self.rt.load_inbox(self.turn_id)
        self.inbox = []
        for r in rows:
            upd.delivered_inbox.append(r["id"])
            self._append(
                upd, Message(role="user", content=r["content"], message_id=r["message_id"])
            )
        if rows:
            upd.event("user_message_delivered", {"count": len(rows)})
        self.inbox_pending = 0

    # ---- tools -------------------------------------------------------------------------

    async def _tool_step(self, upd: TurnUpdate, call: ToolCall) -> bool:
        spec = self.agent.tool(call.name)
        trip = self._duration_trip() or (
            limits.before_tool_call(self.policy, self._counters()) if spec else None
        )
        if trip:
            await self._end(upd, trip.event, trip.reason)
            return True
        timeout_s = self._cut_to_budget(
            (spec.timeout_ms if spec else None) or self.policy.tool_timeout_ms
        )
        ctx = ToolContext(
            turn_id=self.turn_id,
            tool_call_id=call.id,
            idempotency_key=f"{self.turn_id}:{call.id}",
            timeout_s=timeout_s,
        )
        self._add(upd, "steps")
        attempt: dict[str, Any] = {
            "tool_call_id": call.id,
            "tool": call.name,
            "idempotency_key": ctx.idempotency_key,
        }
        started = time.monotonic()
        failure: Failure | None = None
        content = ""
        try:
            content = await self._call(
                self.rt.tools.run(spec, call, ctx), timeout_s, ErrorClass.TOOL_TIMEOUT
            )
        except FailureError as e:
            failure = e.failure
        except CallCancelled:
            upd.event("tool_attempt", {**attempt, **_took(started), "outcome": "cancelled"})
            raise
        attempt.update(_took(started))
        label = call.name if spec else "unknown"
        metrics.tool_call_duration.labels(label).observe(time.monotonic() - started)
        metrics.tool_calls.labels(label, failure.error_class.value if failure else "ok").inc()
        if failure is None or failure.error_class in _EXECUTED:
            self._add(upd, "tool_calls")
        if failure is None:
            upd.event("tool_attempt", {**attempt, "outcome": "ok"})
            self._reset_retries(upd)
            self._append(
                upd, Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
            )
            await self._commit(upd)
            return False
        upd.event("tool_attempt", {**attempt, "outcome": "error", **_failure_fields(failure)})
        if await self._ended_by_duration(upd, failure):
            return True
        if self.policy.tool_error_strategy is ToolErrorStrategy.RETURN_ERROR_TO_MODEL:
            metrics.errors.labels(failure.source.value, failure.error_class.value).inc()
            # A tool error handed to the model is a tool result, never a retry.
            self._reset_retries(upd)
            code = failure.code or failure.error_class.value
            self._append(upd, tool_error_result(self.policy, call, code, failure.message))
            await self._commit(upd)
            return False
        return await self._on_failure(upd, failure)

    # ---- failures, endings -------------------------------------------------------------

    async def _on_failure(self, upd: TurnUpdate, failure: Failure) -> bool:
        """A failed model call or (FAIL_RUN) tool call: retry, park, or fail (RUNNER.md)."""
        retry = self.policy.retry
        retry_on = retry.retryable_classes()
        metrics.errors.labels(failure.source.value, failure.error_class.value).inc()
        upd.values["last_error"] = failure.to_json(retry_on)
        cls = failure.error_class.value
        alt = upd.fork()
        if (
            failure.retryable(retry_on)
            and self.counts["consecutive_retry_count"] < retry.max_retries
        ):
            n = self.counts["consecutive_retry_count"] + 1
            delay = retry_delay(retry, n, failure.retry_after_ms)
            self._add(upd, "consecutive_retry_count")
            self._add(upd, "retry_count")
            upd.values["next_runnable_at"] = datetime.now(UTC) + timedelta(
                milliseconds=delay.delay_ms
            )
            upd.event(
                "retry_scheduled",
                {
                    "retry": n,
                    "max_retries": retry.max_retries,
                    "error_class": cls,
                    "source": failure.source.value,
                    "delay_ms": delay.delay_ms,
                    "computed_delay_ms": delay.computed_ms,
                    "retry_after_ms": failure.retry_after_ms,
                    "retry_after_honoured": delay.retry_after_honoured,
                },
            )
            reason = f"{cls}: retry {n}/{retry.max_retries} in {delay.delay_ms} ms"
            stopped = await self._stop(upd, alt, TurnEvent.SCHEDULE_RETRY, reason)
            if stopped:
                metrics.retries_scheduled.labels(failure.source.value, cls).inc()
            return stopped
        why = "not retryable" if not failure.retryable(retry_on) else "retries exhausted"
        if failure.source is Source.MODEL:
            reason = f"{cls} ({why}): {failure.message}"
            return await self._stop(upd, alt, TurnEvent.WAIT_FOR_MODEL, reason)
        await self._end(upd, TurnEvent.FAIL, f"{cls} ({why}): {failure.message}")
        return True

    async def _stop(
        self, upd: TurnUpdate, alt: TurnUpdate, event: TurnEvent, reason: str | None = None
    ) -> bool:
        """Complete or park, unless user messages are waiting when it commits: then `alt` is
        written instead and we answer them. True when the turn stopped running."""
        upd.move(event, reason)
        upd.release_lease = True
        upd.if_inbox = alt
        await self._commit(upd)
        return self.status is not TurnStatus.RUNNING

    async def _ended_by_duration(self, upd: TurnUpdate, failure: Failure) -> bool:
        """A call whose timeout was cut to the turn's remaining time ran out of it: that is
        max_duration_ms tripping (BUDGET_EXCEEDED), not a failure to retry or report."""
        if failure.error_class not in (ErrorClass.TIMEOUT, ErrorClass.TOOL_TIMEOUT):
            return False
        trip = self._duration_trip()
        if trip is None:
            return False
        await self._end(upd, trip.event, trip.reason)
        return True

    async def _end(self, upd: TurnUpdate, event: TurnEvent, reason: str) -> None:
        """Finish other than COMPLETED: close the transcript exactly once, then move."""
        for m in closing_messages(self.messages, self.policy, reason):
            self._append(upd, m)
        if event is TurnEvent.CANCEL:
            upd.event("cancelled", {"reason": reason})
        upd.move(event, reason)
        await self._commit(upd)

    async def _fail_internal(self, exc: Exception) -> None:
        failure = Failure.of(ErrorClass.INTERNAL, f"internal error ({type(exc).__name__})")
        metrics.errors.labels(failure.source.value, failure.error_class.value).inc()
        upd = TurnUpdate(self.status)
        upd.values["last_error"] = failure.to_json()
        try:
            if self.status.is_terminal:
                return
            await self._end(upd, TurnEvent.FAIL, f"internal: {failure.message}")
        except Exception:
            log.exception(
                "could not record the failure; the lease will expire",
                extra={"turn_id": self.turn_id},
            )

    async def _commit_and_release(self, upd: TurnUpdate) -> None:
        upd.release_lease = True
        await self._commit(upd)

    # ---- plumbing ----------------------------------------------------------------------

    async def _call(self, coro: Any, timeout_s: float, timeout_class: ErrorClass) -> Any:
        """Run a model or tool call so that a cancel can abort it and a timeout bounds it."""
        task = asyncio.ensure_future(asyncio.wait_for(coro, timeout_s))
        self._inflight = task
        if self.cancel_requested:
            task.cancel()
        try:
            return await task
        except TimeoutError:
            raise FailureError(
                Failure.of(timeout_class, f"no answer within {timeout_s:.3f} s")
            ) from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the worker itself is being cancelled
            raise CallCancelled() from None
        finally:
            self._inflight = None

    def _append(self, upd: TurnUpdate, m: Message) -> None:
        upd.message(m)
        self.messages.append(m)
        self.context.append(m)

    def _counters(self) -> Counters:
        c = self.counts
        return Counters(
            c["iterations"], c["steps"], c["tool_calls"], c["input_tokens"], c["output_tokens"]
        )

    def _add(self, upd: TurnUpdate, counter: str, n: int = 1) -> None:
        upd.add(counter, n)
        self.counts[counter] += n

    def _reset_retries(self, upd: TurnUpdate) -> None:
        upd.values["consecutive_retry_count"] = 0
        self.counts["consecutive_retry_count"] = 0

    def _elapsed_ms(self) -> int:
        return int((datetime.now(UTC) - self.created_at).total_seconds() * 1000)

    def _duration_trip(self) -> LimitTrip | None:
        return limits.duration_exceeded(self.policy, self._elapsed_ms())

    def _cut_to_budget(self, timeout_ms: int) -> float:
        left = limits.remaining_duration_ms(self.policy, self._elapsed_ms())
        return max(0.001, (timeout_ms if left is None else min(timeout_ms, left)) / 1000)

    async def _cancel_reason(self) -> str:
        if self.cancel_reason is None:
            # A NOTIFY hint names only the turn; the reason the caller gave is in its row.
            self.cancel_reason = await self.rt.load_cancel_reason(self.turn_id)
        return self.cancel_reason or self.policy.cancellation_reason

    async def _commit(self, upd: TurnUpdate) -> None:
        applied = await self.rt.writer.write(self.turn_id, self.token, upd)
        if not applied.ok:
            raise LeaseLost()
        if applied.took_inbox_branch and upd.if_inbox is not None:
            # User messages were waiting: we stay RUNNING and answer them first.
            upd = upd.if_inbox
            self.answer_inbox = True
        self.counts.update(applied.counters)
        if upd.status is not self.status and upd.status is not TurnStatus.RUNNING:
            error = upd.values.get("last_error") or {}
            log.info(
                "turn %s",
                upd.status.value.lower(),
                extra={
                    "turn_id": self.turn_id,
                    "agent": self.agent_label,
                    "status": upd.status.value,
                    "reason": upd.values.get("status_reason"),
                    "error_class": error.get("error_class"),
                },
            )
        self.status = upd.status
        if applied.cancel_requested and not self.cancel_requested:
            self.request_cancel(applied.cancel_reason)
        self.inbox_pending = applied.inbox_pending


def _took(started: float) -> dict[str, int]:
    """The `duration_ms` of an attempt that started at `started` (time.monotonic)."""
    return {"duration_ms": int((time.monotonic() - started) * 1000)}


def _failure_fields(f: Failure) -> dict[str, Any]:
    return {
        "error_class": f.error_class.value,
        "http_status": f.http_status,
        "code": f.code,
        "retry_after_ms": f.retry_after_ms,
        "message": f.message,
        "failure_id": f.failure_id,
    }
