"""One error taxonomy for retries, the event log, `last_error` and metrics (RUNNER.md, "Errors")."""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class ErrorClass(StrEnum):
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    QUOTA_EXCEEDED = "quota_exceeded"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    AUTH = "auth"
    BAD_REQUEST = "bad_request"
    INVALID_RESPONSE = "invalid_response"
    TOOL_TIMEOUT = "tool_timeout"
    TOOL_UNAVAILABLE = "tool_unavailable"
    TOOL_FAILED = "tool_failed"
    TOOL_NOT_FOUND = "tool_not_found"
    INVALID_ARGUMENTS = "invalid_arguments"
    INTERNAL = "internal"


class Source(StrEnum):
    MODEL = "model"
    TOOL = "tool"
    RUNNER = "runner"


C = ErrorClass
SOURCE_OF: dict[ErrorClass, Source] = {
    **{
        c: Source.MODEL
        for c in (
            C.RATE_LIMITED,
            C.OVERLOADED,
            C.SERVER_ERROR,
            C.TIMEOUT,
            C.CONNECTION,
            C.QUOTA_EXCEEDED,
            C.CONTEXT_LENGTH_EXCEEDED,
            C.AUTH,
            C.BAD_REQUEST,
            C.INVALID_RESPONSE,
        )
    },
    **{
        c: Source.TOOL
        for c in (
            C.TOOL_TIMEOUT,
            C.TOOL_UNAVAILABLE,
            C.TOOL_FAILED,
            C.TOOL_NOT_FOUND,
            C.INVALID_ARGUMENTS,
        )
    },
    C.INTERNAL: Source.RUNNER,
}

# Transient faults only; an unknown error is `internal` and never retried.
DEFAULT_RETRYABLE = frozenset(
    {
        C.RATE_LIMITED,
        C.OVERLOADED,
        C.SERVER_ERROR,
        C.TIMEOUT,
        C.CONNECTION,
        C.TOOL_TIMEOUT,
        C.TOOL_UNAVAILABLE,
    }
)

_QUOTA_CODES = {
    "insufficient_quota",
    "billing_hard_limit_reached",
    "billing_not_active",
    "quota_exceeded",
}
_CONTEXT_CODES = {"context_length_exceeded", "string_above_max_length", "context_window_exceeded"}
_RATE_CODES = {"rate_limit_exceeded", "rate_limited", "too_many_requests"}
_OVERLOAD_CODES = {"overloaded", "overloaded_error", "service_unavailable", "engine_overloaded"}
_SERVER_CODES = {"server_error", "internal_server_error", "internal_error", "api_error"}


def classify_model_http(status: int, code: str | None, message: str | None = None) -> ErrorClass:
    """The class of a model provider's HTTP error from its status and its body's code/type."""
    codes = {c.lower() for c in (code,) if c}
    text = (message or "").lower()
    if codes & _QUOTA_CODES or "insufficient_quota" in text:
        return C.QUOTA_EXCEEDED
    if codes & _CONTEXT_CODES or (
        status in (400, 413)
        and ("context length" in text or "context_length" in text or "maximum context" in text)
    ):
        return C.CONTEXT_LENGTH_EXCEEDED
    if status == 429 or codes & _RATE_CODES:
        return C.RATE_LIMITED
    if status in (503, 529) or codes & _OVERLOAD_CODES:
        return C.OVERLOADED
    if status >= 500 or codes & _SERVER_CODES:
        return C.SERVER_ERROR  # 500, 502, 504, and the rest (501, 505, a proxy's 52x)
    if status in (401, 403):
        return C.AUTH
    if status == 408:
        return C.TIMEOUT
    # 400, 404, 422, any other 4xx, and answers a client cannot use (1xx, 3xx): the request
    # or the endpoint is wrong, and a retry will not fix it.
    return C.BAD_REQUEST


def classify_tool_http(status: int) -> ErrorClass:
    """The class of an `http` tool's non-2xx answer (API.md, ToolSpec)."""
    if status in (408, 429) or status >= 500:
        return C.TOOL_UNAVAILABLE
    return C.TOOL_FAILED


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_HOSTPORT = re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|[\w-]+(?:\.[\w-]+)*):\d{2,5}\b")
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")
_TRACE = re.compile(r"Traceback \(most recent call last\):.*", re.DOTALL)


def sanitize(message: str, limit: int = 500) -> str:
    """A message fit to show a client or a model: no stack trace, no URL, no host, bounded."""
    text = _TRACE.sub("", message)
    text = _URL.sub("<url>", text)
    text = _HOSTPORT.sub("<host>", text)
    text = _IP.sub("<host>", text)
    text = " ".join(text.split())
    return text[:limit] if text else "error"


def new_failure_id() -> str:
    return "fail_" + uuid.uuid4().hex


@dataclass(frozen=True)
class Failure:
    """A classified failure, as `last_error` shows it (API.md, Failure)."""

    source: Source
    error_class: ErrorClass
    message: str
    http_status: int | None = None
    code: str | None = None
    retry_after_ms: int | None = None
    failure_id: str = field(default_factory=new_failure_id)
    at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @classmethod
    def of(cls, error_class: ErrorClass, message: str, **kw: Any) -> Failure:
        """A failure whose source follows from its class; the message is sanitized."""
        return cls(
            source=SOURCE_OF[error_class], error_class=error_class, message=sanitize(message), **kw
        )

    def retryable(self, retry_on: frozenset[ErrorClass] | None = None) -> bool:
        """Whether a retry may fix it; an unknown (`internal`) error never, whatever retry_on
        says."""
        if self.error_class is ErrorClass.INTERNAL:
            return False
        return self.error_class in (DEFAULT_RETRYABLE if retry_on is None else retry_on)

    def to_json(self, retry_on: frozenset[ErrorClass] | None = None) -> dict[str, Any]:
        data = asdict(self)
        data["source"] = self.source.value
        data["error_class"] = self.error_class.value
        data["at"] = self.at.isoformat().replace("+00:00", "Z")
        data["retryable"] = self.retryable(retry_on)
        return data


class FailureError(Exception):
    """Raised by a model provider or a tool executor with its classified failure."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.error_class.value}: {failure.message}")
        self.failure = failure
