"""One error taxonomy (RUNNER.md, "Errors"): classification, retryable defaults, sanitizing and
the Failure shape of API.md."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from app.domain.failures import (
    DEFAULT_RETRYABLE,
    SOURCE_OF,
    ErrorClass,
    Failure,
    FailureError,
    Source,
    classify_model_http,
    classify_tool_http,
    new_failure_id,
    sanitize,
)

C = ErrorClass

# RUNNER.md's taxonomy: class -> (source, retryable by default).
TAXONOMY: dict[str, tuple[str, bool]] = {
    "rate_limited": ("model", True),
    "overloaded": ("model", True),
    "server_error": ("model", True),
    "timeout": ("model", True),
    "connection": ("model", True),
    "quota_exceeded": ("model", False),
    "context_length_exceeded": ("model", False),
    "auth": ("model", False),
    "bad_request": ("model", False),
    "invalid_response": ("model", False),
    "tool_timeout": ("tool", True),
    "tool_unavailable": ("tool", True),
    "tool_failed": ("tool", False),
    "tool_not_found": ("tool", False),
    "invalid_arguments": ("tool", False),
    "internal": ("runner", False),
}


def test_error_classes_are_exactly_the_taxonomy() -> None:
    assert {c.value for c in ErrorClass} == set(TAXONOMY)


@pytest.mark.parametrize(("name", "row"), list(TAXONOMY.items()))
def test_source_of_each_class(name: str, row: tuple[str, bool]) -> None:
    assert SOURCE_OF[ErrorClass(name)].value == row[0]


def test_default_retryable_set_exactly() -> None:
    assert {c.value for c in DEFAULT_RETRYABLE} == {
        "rate_limited",
        "overloaded",
        "server_error",
        "timeout",
        "connection",
        "tool_timeout",
        "tool_unavailable",
    }
    assert {n for n, (_, r) in TAXONOMY.items() if r} == {c.value for c in DEFAULT_RETRYABLE}


# ---- classify_model_http ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "message", "expected"),
    [
        # rate_limited: HTTP 429, rate_limit_exceeded
        (429, None, None, C.RATE_LIMITED),
        (429, "rate_limit_exceeded", "Rate limit reached for requests", C.RATE_LIMITED),
        (400, "rate_limit_exceeded", None, C.RATE_LIMITED),
        (429, "RATE_LIMIT_EXCEEDED", None, C.RATE_LIMITED),
        # overloaded: 503, 529, overloaded
        (503, None, None, C.OVERLOADED),
        (529, None, None, C.OVERLOADED),
        (529, "overloaded_error", "Overloaded", C.OVERLOADED),
        (500, "overloaded", None, C.OVERLOADED),
        # server_error: 500, 502, 504
        (500, None, None, C.SERVER_ERROR),
        (502, None, "Bad gateway", C.SERVER_ERROR),
        (504, None, None, C.SERVER_ERROR),
        (500, "server_error", "The server had an error", C.SERVER_ERROR),
        # quota_exceeded: insufficient_quota, billing — even with status 429
        (429, "insufficient_quota", "You exceeded your current quota", C.QUOTA_EXCEEDED),
        (429, None, "insufficient_quota: check your plan", C.QUOTA_EXCEEDED),
        (403, "billing_hard_limit_reached", None, C.QUOTA_EXCEEDED),
        (400, "insufficient_quota", None, C.QUOTA_EXCEEDED),
        # context_length_exceeded: the code, or 400/413 with that meaning
        (400, "context_length_exceeded", None, C.CONTEXT_LENGTH_EXCEEDED),
        (
            400,
            None,
            "This model's maximum context length is 8192 tokens. However, you requested 9000",
            C.CONTEXT_LENGTH_EXCEEDED,
        ),
        (
            400,
            "invalid_request_error",
            "Input exceeds the context length",
            C.CONTEXT_LENGTH_EXCEEDED,
        ),
        (413, None, "prompt is longer than the maximum context", C.CONTEXT_LENGTH_EXCEEDED),
        # auth: 401, 403
        (401, None, None, C.AUTH),
        (401, "invalid_api_key", "Incorrect API key provided", C.AUTH),
        (403, None, None, C.AUTH),
        # bad_request: other 400, 404, 422
        (400, None, None, C.BAD_REQUEST),
        (400, "invalid_request_error", "temperature must be <= 2", C.BAD_REQUEST),
        (404, "model_not_found", "The model does not exist", C.BAD_REQUEST),
        (422, None, None, C.BAD_REQUEST),
    ],
)
def test_classify_model_http(
    status: int, code: str | None, message: str | None, expected: ErrorClass
) -> None:
    assert classify_model_http(status, code, message) is expected


@pytest.mark.parametrize("status", [429, 503, 529, 500, 502, 504])
def test_classified_transient_model_errors_are_retryable(status: int) -> None:
    assert classify_model_http(status, None) in DEFAULT_RETRYABLE


@pytest.mark.parametrize(
    ("status", "code"),
    [(429, "insufficient_quota"), (400, "context_length_exceeded"), (401, None), (404, None)],
)
def test_classified_permanent_model_errors_are_not_retryable(status: int, code: str | None) -> None:
    assert classify_model_http(status, code) not in DEFAULT_RETRYABLE


# ---- classify_tool_http -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (408, C.TOOL_UNAVAILABLE),
        (429, C.TOOL_UNAVAILABLE),
        (500, C.TOOL_UNAVAILABLE),
        (502, C.TOOL_UNAVAILABLE),
        (503, C.TOOL_UNAVAILABLE),
        (504, C.TOOL_UNAVAILABLE),
        (599, C.TOOL_UNAVAILABLE),
        (400, C.TOOL_FAILED),
        (401, C.TOOL_FAILED),
        (403, C.TOOL_FAILED),
        (404, C.TOOL_FAILED),
        (409, C.TOOL_FAILED),
        (422, C.TOOL_FAILED),
        (499, C.TOOL_FAILED),
    ],
)
def test_classify_tool_http(status: int, expected: ErrorClass) -> None:
    got = classify_tool_http(status)
    assert got is expected
    assert SOURCE_OF[got] is Source.TOOL


# ---- retryable --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(ErrorClass), ids=lambda c: c.value)
def test_failure_retryable_by_default(cls: ErrorClass) -> None:
    assert Failure.of(cls, "x").retryable() is TAXONOMY[cls.value][1]


def test_retry_on_replaces_the_default_set() -> None:
    retry_on = frozenset({C.AUTH, C.TOOL_FAILED})
    assert Failure.of(C.AUTH, "x").retryable(retry_on) is True
    assert Failure.of(C.TOOL_FAILED, "x").retryable(retry_on) is True
    # Replaced, not added to: a default-retryable class is no longer retried.
    assert Failure.of(C.RATE_LIMITED, "x").retryable(retry_on) is False
    assert Failure.of(C.TOOL_TIMEOUT, "x").retryable(retry_on) is False


def test_empty_retry_on_retries_nothing() -> None:
    for cls in ErrorClass:
        assert Failure.of(cls, "x").retryable(frozenset()) is False


def test_internal_is_never_retried_by_default() -> None:
    assert Failure.of(C.INTERNAL, "x").retryable() is False
    assert C.INTERNAL not in DEFAULT_RETRYABLE


# ---- sanitize ---------------------------------------------------------------------------------


def test_sanitize_strips_traceback() -> None:
    msg = (
        "tool crashed\nTraceback (most recent call last):\n"
        '  File "/srv/app/tools/x.py", line 12, in run\n'
        "    cursor.execute('SELECT * FROM secrets')\n"
        "ValueError: boom"
    )
    out = sanitize(msg)
    assert out == "tool crashed"
    for leaked in ("Traceback", "File", "/srv/app", "line 12", "SELECT"):
        assert leaked not in out


def test_sanitize_traceback_only_gives_a_placeholder() -> None:
    assert sanitize("Traceback (most recent call last):\n  File 'x'\nKeyError: 1") == "error"


@pytest.mark.parametrize(
    ("message", "leaked"),
    [
        ("POST http://tools.internal.example:8443/run?token=abc failed", "tools.internal"),
        ("fetch https://10.1.2.3/v1/chat/completions returned 500", "10.1.2.3"),
        ("see postgresql://user:pw@db.internal:5432/app", "db.internal"),
        ("redirected to HTTPS://Internal-Host.corp/x", "Internal-Host"),
    ],
)
def test_sanitize_strips_urls(message: str, leaked: str) -> None:
    out = sanitize(message)
    assert leaked not in out
    assert "://" not in out
    assert "<url>" in out


@pytest.mark.parametrize(
    ("message", "leaked"),
    [
        ("connect to db.internal.example:5432 refused", "db.internal"),
        ("connect to localhost:8080 refused", "localhost"),
        ("connect to 10.0.0.7:6379 refused", "10.0.0.7"),
        ("connect to api-01.prod.corp:443 timed out", "api-01"),
        # Single-label internal names, as in this project's docker-compose.yml
        # (TURNRUNNER_DATABASE_URL points at postgres:5432; the fake LLM is fake-llm:8080).
        ("connect to postgres:5432 refused", "postgres"),
        ("connect to fake-llm:8080 refused", "fake-llm"),
    ],
)
def test_sanitize_strips_host_port(message: str, leaked: str) -> None:
    out = sanitize(message)
    assert leaked not in out
    assert "<host>" in out
    assert out.startswith("connect to ")


@pytest.mark.parametrize("ip", ["10.0.0.7", "192.168.1.20", "172.18.0.2", "127.0.0.1"])
def test_sanitize_strips_ips(ip: str) -> None:
    out = sanitize(f"host {ip} unreachable")
    assert out == "host <host> unreachable"


def test_sanitize_collapses_whitespace() -> None:
    assert sanitize("  a \n\t b\r\n  c  ") == "a b c"


def test_sanitize_bounds_length() -> None:
    assert len(sanitize("x" * 10_000)) == 500
    assert sanitize("abcdef", limit=3) == "abc"
    assert sanitize("word " * 1000, limit=100) == ("word " * 20)[:100]


def test_sanitize_empty_gives_placeholder() -> None:
    assert sanitize("") == "error"
    assert sanitize("   \n ") == "error"


def test_sanitize_keeps_ordinary_text() -> None:
    text = "argument 'x' must be a number, got 'abc' (3 of 5 allowed)"
    assert sanitize(text) == text


# ---- Failure ----------------------------------------------------------------------------------


def test_failure_of_derives_source_and_sanitizes() -> None:
    f = Failure.of(C.TOOL_UNAVAILABLE, "connect to 10.0.0.7:80 refused", http_status=503)
    assert f.source is Source.TOOL
    assert f.message == "connect to <host> refused"
    assert f.http_status == 503
    assert Failure.of(C.AUTH, "x").source is Source.MODEL
    assert Failure.of(C.INTERNAL, "x").source is Source.RUNNER


def test_failure_ids_are_unique_and_prefixed() -> None:
    ids = {new_failure_id() for _ in range(100)} | {Failure.of(C.AUTH, "x").failure_id}
    assert len(ids) == 101
    assert all(re.fullmatch(r"fail_[0-9a-f]{32}", i) for i in ids)


def test_failure_to_json_shape() -> None:
    at = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    f = Failure.of(
        C.RATE_LIMITED,
        "Rate limit reached",
        http_status=429,
        code="rate_limit_exceeded",
        retry_after_ms=1500,
        failure_id="fail_abc",
        at=at,
    )
    data = f.to_json()
    assert data == {
        "failure_id": "fail_abc",
        "source": "model",
        "error_class": "rate_limited",
        "http_status": 429,
        "code": "rate_limit_exceeded",
        "message": "Rate limit reached",
        "retryable": True,
        "retry_after_ms": 1500,
        "at": "2024-05-06T07:08:09.123000Z",
    }
    assert json.loads(json.dumps(data)) == data


def test_failure_to_json_defaults_and_retry_on() -> None:
    f = Failure.of(C.TOOL_FAILED, "bad input")
    data = f.to_json()
    assert set(data) == {
        "failure_id",
        "source",
        "error_class",
        "http_status",
        "code",
        "message",
        "retryable",
        "retry_after_ms",
        "at",
    }
    assert data["source"] == "tool"
    assert data["http_status"] is None
    assert data["code"] is None
    assert data["retry_after_ms"] is None
    assert data["retryable"] is False
    assert data["at"].endswith("Z")
    assert datetime.fromisoformat(data["at"].replace("Z", "+00:00")) == f.at
    assert f.to_json(frozenset({C.TOOL_FAILED}))["retryable"] is True
    assert Failure.of(C.TIMEOUT, "slow").to_json(frozenset())["retryable"] is False


def test_failure_error_carries_the_failure() -> None:
    f = Failure.of(C.TOOL_TIMEOUT, "took too long")
    err = FailureError(f)
    assert err.failure is f
    assert str(err) == "tool_timeout: took too long"
