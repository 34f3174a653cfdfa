"""The scripted model: the n-th model call of a turn gets the n-th reply (the last one repeats)."""

from __future__ import annotations

import asyncio

from app.domain.failures import ErrorClass, Failure, FailureError, classify_model_http
from app.domain.transcript import ToolCall
from app.models.base import ModelReply, ModelRequest


class ScriptedProvider:
    """Deterministic replies for demos and tests; no network."""

    async def complete(self, request: ModelRequest) -> ModelReply:
        script = request.spec.script or []
        reply = script[min(request.call_index, len(script) - 1)]
        if reply.hang_ms is not None:
            # A model that never answers in time: the caller's timeout fires first, or this does.
            await asyncio.sleep(reply.hang_ms / 1000)
            raise FailureError(Failure.of(ErrorClass.TIMEOUT, "model did not answer in time"))
        if reply.error is not None:
            e = reply.error
            message = e.message or f"scripted error {e.status}"
            raise FailureError(
                Failure.of(
                    classify_model_http(e.status, e.code, message),
                    message,
                    http_status=e.status,
                    code=e.code,
                    retry_after_ms=e.retry_after_ms,
                )
            )
        usage = reply.usage
        return ModelReply(
            content=reply.content,
            tool_calls=[
                ToolCall(f"call_{request.call_index}_{i}", c.name, dict(c.arguments))
                for i, c in enumerate(reply.tool_calls or [])
            ],
            input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0,
        )
