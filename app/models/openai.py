"""The OpenAI-compatible Chat Completions provider (API.md, ModelSpec `"provider": "openai"`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx

from app.domain.agent import ModelSpec, ToolSpec
from app.domain.failures import ErrorClass, Failure, FailureError, classify_model_http
from app.domain.retry_after import parse_retry_after
from app.domain.transcript import Message, ToolCall
from app.models.base import ModelReply, ModelRequest

DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Keys the provider owns: `params` may tune the model but must not replace the conversation,
# and a streamed answer (`stream`) is a body this provider cannot parse.
_RESERVED_PARAMS = frozenset({"model", "messages", "tools", "stream"})

_TIMEOUT_TYPES: tuple[type[BaseException], ...] = (httpx.TimeoutException, TimeoutError)
# TimeoutError is an OSError subclass, so timeouts are matched before these.
_CONNECTION_TYPES: tuple[type[BaseException], ...] = (
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
    ConnectionError,
    socket.gaierror,
    OSError,
)
_DECODE_TYPES: tuple[type[BaseException], ...] = (
    json.JSONDecodeError,
    UnicodeDecodeError,
    httpx.DecodingError,
)


class OpenAIProvider:
    """A model behind any OpenAI-compatible `/chat/completions` endpoint; never retries itself."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        # The default transport makes exactly one attempt (retries=0): retrying is the
        # runner's decision, recorded in the turn's event log, never a hidden one here.
        self._client = client if client is not None else httpx.AsyncClient()
        self._owns_client = client is None

    async def aclose(self) -> None:
        """Close the HTTP client if this provider created it."""
        if self._owns_client:
            await self._client.aclose()

    async def complete(self, request: ModelRequest) -> ModelReply:
        """One model call; raises FailureError with a classified, sanitized failure."""
        spec = request.spec
        key = _api_key(spec)
        secrets = _secrets(spec, key)
        if request.timeout_s <= 0:
            raise FailureError(Failure.of(ErrorClass.TIMEOUT, "no time left for the model call"))
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            # httpx's timeout bounds each phase; asyncio.timeout bounds the whole call, so a
            # server trickling bytes cannot hold the call past the turn's remaining time.
            async with asyncio.timeout(request.timeout_s):
                response = await self._client.post(
                    _endpoint(spec),
                    json=build_body(request),
                    headers=headers,
                    timeout=httpx.Timeout(request.timeout_s),
                )
        except Exception as exc:  # CancelledError is a BaseException and passes through.
            raise FailureError(_exception_failure(exc, request.timeout_s, secrets)) from exc
        if not response.is_success:
            raise FailureError(_http_failure(response, secrets))
        try:
            data = response.json()
        except ValueError as exc:
            raise FailureError(
                Failure.of(
                    ErrorClass.INVALID_RESPONSE,
                    "model answered with a body that is not JSON",
                    http_status=response.status_code,
                )
            ) from exc
        return parse_reply(data)


def _endpoint(spec: ModelSpec) -> str:
    return (spec.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"


def _api_key(spec: ModelSpec) -> str | None:
    if not spec.api_key_env:
        return None
    key = os.environ.get(spec.api_key_env)
    if not key:
        # A missing key is an operator's repair, like a revoked one: not retried automatically.
        raise FailureError(
            Failure.of(ErrorClass.AUTH, f"environment variable {spec.api_key_env} is not set")
        )
    return key


def _secrets(spec: ModelSpec, key: str | None) -> list[str]:
    """Strings that must never reach a failure message: the key, the base URL and its host."""
    base = spec.base_url or DEFAULT_BASE_URL
    found = [key or "", base.rstrip("/"), urlparse(base).netloc, urlparse(base).hostname or ""]
    return sorted({s for s in found if s}, key=len, reverse=True)


def _redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "<redacted>")
    return text


def build_body(request: ModelRequest) -> dict[str, Any]:
    """The Chat Completions request body for a model request."""
    spec = request.spec
    params = {k: v for k, v in spec.params.items() if k not in _RESERVED_PARAMS}
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": [to_openai_message(m) for m in request.messages],
        **params,
    }
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
    return body


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def to_openai_message(message: Message) -> dict[str, Any]:
    """A transcript message in OpenAI's shape; `meta` and `message_id` stay with us."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content or "",
        }
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [_openai_tool_call(c) for c in message.tool_calls]
        return out
    return {"role": message.role, "content": message.content or ""}


def _openai_tool_call(call: ToolCall) -> dict[str, Any]:
    # Give the model back exactly what it sent when that was not a JSON object.
    arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _invalid(message: str) -> FailureError:
    return FailureError(Failure.of(ErrorClass.INVALID_RESPONSE, message))


def parse_reply(data: Any) -> ModelReply:
    """The model's answer from a Chat Completions response body."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _invalid("model answer has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _invalid("model answer has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _invalid("model answer content is not a string")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _invalid("model answer tool_calls is not a list")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ModelReply(
        content=content,
        tool_calls=[_parse_tool_call(c) for c in raw_calls],
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
    )


def _parse_tool_call(raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(function, dict) or not isinstance(name, str) or not name:
        raise _invalid("model answer has a tool call without a function name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Models send "" for a tool that takes no arguments; that means {} rather than garbage.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise _invalid(f"tool call {name} has arguments that are not valid JSON") from None
    elif arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise _invalid(f"tool call {name} has arguments that are not a JSON object")
    call_id = raw.get("id")
    # An empty id is made unique later by the runner (transcript.unique_tool_call_ids).
    return ToolCall(id=call_id if isinstance(call_id, str) else "", name=name, arguments=arguments)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _http_failure(response: httpx.Response, secrets: list[str]) -> Failure:
    status = response.status_code
    code, kind, message = _error_body(response)
    error_class = classify_model_http(status, code or kind, message)
    text = _redact(
        f"model API answered HTTP {status}: {message or response.reason_phrase}", secrets
    )
    return Failure.of(
        error_class,
        text,
        http_status=status,
        code=code or kind,
        retry_after_ms=parse_retry_after(response.headers),
    )


def _error_body(response: httpx.Response) -> tuple[str | None, str | None, str | None]:
    """(code, type, message) from an OpenAI error body; any other body yields what it can."""
    try:
        body = response.json()
    except ValueError:
        return None, None, None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):  # some compatible servers answer {"error": "text"}
        return None, None, error
    if not isinstance(error, dict):
        detail = (body.get("message") or body.get("detail")) if isinstance(body, dict) else None
        return None, None, detail if isinstance(detail, str) else None

    def text(key: str) -> str | None:
        value = error.get(key)
        return value if isinstance(value, str) and value else None

    return text("code"), text("type"), text("message")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it was raised from or during, outermost first, once each."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested = list(current.exceptions) if isinstance(current, BaseExceptionGroup) else []
        stack.extend(e for e in (current.__cause__, current.__context__, *nested) if e is not None)


def classify_exception(exc: BaseException) -> ErrorClass:
    """The error class of an exception raised while calling a model, from its whole cause chain."""
    for current in _chain(exc):
        if isinstance(current, FailureError):
            return current.failure.error_class
        if isinstance(current, _TIMEOUT_TYPES):
            return ErrorClass.TIMEOUT
        if isinstance(current, _CONNECTION_TYPES):
            return ErrorClass.CONNECTION
        if isinstance(current, _DECODE_TYPES):
            return ErrorClass.INVALID_RESPONSE
    return ErrorClass.INTERNAL


def _exception_failure(exc: Exception, timeout_s: float, secrets: list[str]) -> Failure:
    error_class = classify_exception(exc)
    if error_class is ErrorClass.TIMEOUT:
        return Failure.of(error_class, f"model call timed out after {timeout_s:g}s")
    detail = str(exc).strip()
    name = type(exc).__name__
    text = {
        ErrorClass.CONNECTION: "could not reach the model server",
        ErrorClass.INVALID_RESPONSE: "model answered with a body that could not be decoded",
    }.get(error_class, "unexpected error calling the model")
    return Failure.of(
        error_class,
        _redact(f"{text} ({name}: {detail})" if detail else f"{text} ({name})", secrets),
    )
