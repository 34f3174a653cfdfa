"""The OpenAI provider's error path, classification and parsing, with no network."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from app.domain.agent import ModelSpec, ToolSpec
from app.domain.failures import ErrorClass, FailureError
from app.domain.retry_after import parse_retry_after
from app.domain.transcript import Message, ToolCall
from app.models.base import ModelReply, ModelRequest
from app.models.openai import OpenAIProvider, classify_exception

KEY = "sk-test-SUPERSECRET-0123456789"
HOST = "llm-gateway.corp.internal"
BASE_URL = f"http://{HOST}:8443/v1"

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


def make_request(
    *, timeout_s: float = 5.0, tools: list[ToolSpec] | None = None, **spec: Any
) -> ModelRequest:
    fields: dict[str, Any] = {
        "provider": "openai",
        "model": "gpt-test",
        "base_url": BASE_URL,
        "api_key_env": "TR_UNIT_KEY",
        **spec,
    }
    return ModelRequest(
        spec=ModelSpec(**fields),
        messages=[Message(role="system", content="be brief"), Message(role="user", content="hi")],
        tools=tools or [],
        call_index=0,
        timeout_s=timeout_s,
        turn_id="turn_1",
    )


def call(handler: Handler, request: ModelRequest | None = None) -> ModelReply:
    """Run one provider call against an in-memory transport."""

    async def go() -> ModelReply:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await OpenAIProvider(client).complete(request or make_request())
        finally:
            await client.aclose()

    return asyncio.run(go())


def failure_of(handler: Handler, request: ModelRequest | None = None) -> Any:
    with pytest.raises(FailureError) as info:
        call(handler, request)
    return info.value.failure


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, (dict, list)):
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(status, content=(body or "").encode(), headers=headers)

    return handler


def completion(message: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message}]}
    if usage is not None:
        body["usage"] = usage
    return body


def error_body(message: str, type_: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TR_UNIT_KEY", KEY)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (429, error_body("Rate limit reached", "requests", "rate_limit_exceeded"), "rate_limited"),
        (429, error_body("slow down"), "rate_limited"),
        (429, error_body("quota", "insufficient_quota", "insufficient_quota"), "quota_exceeded"),
        (400, error_body("billing", "insufficient_quota", None), "quota_exceeded"),
        (503, error_body("The engine is currently overloaded", "server_error"), "overloaded"),
        (529, {"type": "error", "error": {"type": "overloaded_error"}}, "overloaded"),
        (500, error_body("The server had an error"), "server_error"),
        (502, "<html>Bad gateway</html>", "server_error"),
        (504, "", "server_error"),
        (401, error_body("Incorrect API key", "invalid_request_error", "invalid_api_key"), "auth"),
        (403, error_body("Forbidden"), "auth"),
        (
            400,
            error_body("too long", "invalid_request_error", "context_length_exceeded"),
            "context_length_exceeded",
        ),
        (
            400,
            error_body("This model's maximum context length is 8192 tokens"),
            "context_length_exceeded",
        ),
        (413, {"error": "context length exceeded"}, "context_length_exceeded"),
        (400, error_body("Invalid value for temperature", "invalid_request_error"), "bad_request"),
        (
            404,
            error_body("The model does not exist", "invalid_request_error", "model_not_found"),
            "bad_request",
        ),
        (422, {"detail": [{"msg": "field required"}]}, "bad_request"),
    ],
)
def test_http_errors_are_classified(status: int, body: Any, expected: str) -> None:
    failure = failure_of(answer(status, body))
    assert failure.error_class == ErrorClass(expected)
    assert failure.http_status == status
    assert failure.source.value == "model"


def test_error_code_and_message_are_kept() -> None:
    body = error_body("Rate limit reached for gpt-test", "requests", "rate_limit_exceeded")
    failure = failure_of(answer(429, body, {"Retry-After": "3"}))
    assert failure.code == "rate_limit_exceeded"
    assert "Rate limit reached for gpt-test" in failure.message
    assert failure.retry_after_ms == 3000
    assert failure.retryable()


def test_type_is_the_code_when_the_body_has_no_code() -> None:
    failure = failure_of(answer(400, error_body("nope", "invalid_request_error", None)))
    assert failure.code == "invalid_request_error"


def test_quota_failure_is_not_retryable() -> None:
    failure = failure_of(
        answer(429, error_body("quota", "insufficient_quota", "insufficient_quota"))
    )
    assert not failure.retryable()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2000),
        ({"retry-after": "0.25"}, 250),
        ({"Retry-After": "0"}, 0),
        ({"retry-after-ms": "1234", "Retry-After": "9"}, 1234),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "nan"}, None),
        ({}, None),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0),  # a date in the past: now
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: int | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    ms = parse_retry_after(httpx.Headers({"Retry-After": format_datetime(when, usegmt=True)}))
    # The date has whole-second precision and a little time passes while the test runs.
    assert ms is not None and 28_000 <= ms <= 30_000


def test_retry_after_date_through_the_provider() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    failure = failure_of(answer(503, error_body("busy"), {"Retry-After": when}))
    assert failure.error_class is ErrorClass.OVERLOADED
    assert 58_000 <= failure.retry_after_ms <= 60_000


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


def _raised_during(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit __context__ is what is under test
    except BaseException as exc:
        return exc


def test_chain_cause_connect_error_is_connection() -> None:
    exc = _raised_from(RuntimeError("wrapper"), httpx.ConnectError("refused"))
    assert classify_exception(exc) is ErrorClass.CONNECTION


def test_chain_context_timeout_is_timeout() -> None:
    exc = _raised_during(KeyError("while handling"), httpx.ReadTimeout("read"))
    assert classify_exception(exc) is ErrorClass.TIMEOUT


def test_chain_three_deep() -> None:
    inner = _raised_from(ValueError("mid"), socket.gaierror(-2, "Name or service not known"))
    exc = _raised_from(RuntimeError("outer"), inner)
    assert classify_exception(exc) is ErrorClass.CONNECTION


def test_chain_json_decode_error_is_invalid_response() -> None:
    decode = json.JSONDecodeError("Expecting value", "x", 0)
    exc = _raised_from(RuntimeError("outer"), decode)
    assert classify_exception(exc) is ErrorClass.INVALID_RESPONSE


def test_builtin_timeout_error_is_timeout_not_connection() -> None:
    # TimeoutError is an OSError; the more specific class must win.
    assert classify_exception(TimeoutError()) is ErrorClass.TIMEOUT
    assert classify_exception(httpx.PoolTimeout("p")) is ErrorClass.TIMEOUT
    assert classify_exception(httpx.ConnectTimeout("c")) is ErrorClass.TIMEOUT


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("x"),
        httpx.ReadError("x"),
        httpx.RemoteProtocolError("x"),
        ConnectionResetError(),
        ConnectionRefusedError(),
        OSError(113, "No route to host"),
    ],
)
def test_network_errors_are_connection(exc: BaseException) -> None:
    assert classify_exception(exc) is ErrorClass.CONNECTION


def test_unknown_errors_are_internal() -> None:
    assert classify_exception(RuntimeError("boom")) is ErrorClass.INTERNAL
    assert classify_exception(_raised_from(KeyError("a"), ZeroDivisionError())) is (
        ErrorClass.INTERNAL
    )


def test_chain_cycle_terminates() -> None:
    a, b = RuntimeError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert classify_exception(a) is ErrorClass.INTERNAL
    c = httpx.ConnectError("c")
    b.__cause__ = c
    assert classify_exception(a) is ErrorClass.CONNECTION


def test_exception_group_members_are_walked() -> None:
    group = ExceptionGroup("many", [RuntimeError("x"), httpx.ConnectError("y")])
    assert classify_exception(group) is ErrorClass.CONNECTION


def raising(exc: BaseException) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def test_transport_connect_error_is_connection_without_host() -> None:
    exc = httpx.ConnectError(f"[Errno 111] Connection refused to {HOST} ({BASE_URL})")
    failure = failure_of(raising(exc))
    assert failure.error_class is ErrorClass.CONNECTION
    assert HOST not in failure.message and "8443" not in failure.message
    assert "Connection refused" in failure.message


def test_transport_error_wrapped_in_another_is_classified_by_its_cause() -> None:
    failure = failure_of(raising(_raised_from(RuntimeError("pool broke"), httpx.ConnectError("x"))))
    assert failure.error_class is ErrorClass.CONNECTION


def test_transport_read_timeout_is_timeout() -> None:
    failure = failure_of(raising(httpx.ReadTimeout("timed out")))
    assert failure.error_class is ErrorClass.TIMEOUT
    assert failure.retryable()


def test_unexpected_exception_is_internal_and_not_retried() -> None:
    failure = failure_of(raising(RuntimeError("kaboom")))
    assert failure.error_class is ErrorClass.INTERNAL
    assert not failure.retryable()


def test_overall_timeout_bounds_the_whole_call() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=completion({"role": "assistant", "content": "late"}))

    started = time.monotonic()
    failure = failure_of(slow, make_request(timeout_s=0.2))
    assert failure.error_class is ErrorClass.TIMEOUT
    assert time.monotonic() - started < 2  # the 5 s answer was not awaited


def test_no_time_left_is_timeout_without_a_request() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"role": "assistant", "content": "x"}))

    assert failure_of(handler, make_request(timeout_s=0)).error_class is ErrorClass.TIMEOUT
    assert seen == []


def test_cancellation_propagates_untouched() -> None:
    started = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        started.set()
        await asyncio.sleep(30)
        raise AssertionError("not reached")

    async def go() -> BaseException | None:
        client = httpx.AsyncClient(transport=httpx.MockTransport(hang))
        task = asyncio.create_task(OpenAIProvider(client).complete(make_request(timeout_s=10)))
        await started.wait()
        task.cancel()
        try:
            await task
        except BaseException as exc:
            return exc
        finally:
            await client.aclose()
        return None

    assert isinstance(asyncio.run(go()), asyncio.CancelledError)


def test_cancelled_error_from_transport_is_not_converted() -> None:
    async def go() -> str:
        client = httpx.AsyncClient(transport=httpx.MockTransport(raising(asyncio.CancelledError())))
        try:
            await OpenAIProvider(client).complete(make_request())
        except asyncio.CancelledError:
            return "cancelled"
        except FailureError:
            return "converted"
        finally:
            await client.aclose()
        return "returned"

    assert asyncio.run(go()) == "cancelled"


def test_invalid_json_tool_arguments_are_invalid_response() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"'},
            }
        ],
    }
    failure = failure_of(answer(200, completion(message)))
    assert failure.error_class is ErrorClass.INVALID_RESPONSE
    assert not failure.retryable()


def test_non_object_tool_arguments_are_invalid_response() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": "[1, 2]"},
            }
        ],
    }
    assert failure_of(answer(200, completion(message))).error_class is ErrorClass.INVALID_RESPONSE


@pytest.mark.parametrize(
    "body",
    [
        "not json at all",
        {"choices": []},
        {"object": "chat.completion"},
        [1, 2],
        {"choices": [{"index": 0}]},
        {"choices": [{"message": {"content": 7}}]},
        {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]},
    ],
)
def test_unusable_bodies_are_invalid_response(body: Any) -> None:
    assert failure_of(answer(200, body)).error_class is ErrorClass.INVALID_RESPONSE


def test_reply_is_parsed() -> None:
    message = {
        "role": "assistant",
        "content": "thinking",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "current_time", "arguments": ""}},
        ],
    }
    reply = call(answer(200, completion(message, {"prompt_tokens": 12, "completion_tokens": 5})))
    assert reply.content == "thinking"
    assert reply.tool_calls == [
        ToolCall("c1", "calculator", {"expression": "6*7"}),
        ToolCall("c2", "current_time", {}),
    ]
    assert (reply.input_tokens, reply.output_tokens) == (12, 5)


def test_missing_usage_counts_zero() -> None:
    reply = call(answer(200, completion({"role": "assistant", "content": "hello"})))
    assert (reply.content, reply.tool_calls, reply.input_tokens, reply.output_tokens) == (
        "hello",
        [],
        0,
        0,
    )


def test_request_shape() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"role": "assistant", "content": "ok"}))

    tool = ToolSpec(
        name="calculator",
        description="math",
        kind="builtin",
        builtin="calculator",
        parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
    )
    request = make_request(
        tools=[tool], timeout_s=7.5, params={"temperature": 0, "model": "evil", "stream": True}
    )
    request = ModelRequest(
        spec=request.spec,
        messages=[
            Message(role="user", content="6*7?", message_id="m1", meta={"x": 1}),
            Message(
                role="assistant",
                content=None,
                tool_calls=(ToolCall("c1", "calculator", {"expression": "6*7"}),),
            ),
            Message(role="tool", content="42", tool_call_id="c1", name="calculator"),
        ],
        tools=request.tools,
        call_index=1,
        timeout_s=request.timeout_s,
        turn_id="t",
    )
    call(handler, request)
    sent = seen[0]
    assert str(sent.url) == f"{BASE_URL}/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.extensions["timeout"] == {"connect": 7.5, "read": 7.5, "write": 7.5, "pool": 7.5}
    body = json.loads(sent.content)
    assert body == {
        "model": "gpt-test",
        "temperature": 0,
        "messages": [
            {"role": "user", "content": "6*7?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "description": "math",
                    "parameters": {
                        "type": "object",
                        "properties": {"expression": {"type": "string"}},
                    },
                },
            }
        ],
    }


def test_default_base_url_and_no_key() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"role": "assistant", "content": "ok"}))

    call(handler, make_request(base_url=None, api_key_env=None))
    assert str(seen[0].url) == "https://api.openai.com/v1/chat/completions"
    assert "authorization" not in seen[0].headers
    assert "tools" not in json.loads(seen[0].content)


def test_key_never_appears_in_failure_messages() -> None:
    # OpenAI echoes (part of) a rejected key in its message; some proxies echo the URL too.
    body = error_body(
        f"Incorrect API key provided: {KEY} for {BASE_URL}",
        "invalid_request_error",
        "invalid_api_key",
    )
    failure = failure_of(answer(401, body))
    assert failure.error_class is ErrorClass.AUTH
    assert KEY not in failure.message and HOST not in failure.message
    assert KEY not in json.dumps(failure.to_json())

    exc_failure = failure_of(raising(httpx.ConnectError(f"proxy rejected Bearer {KEY} at {HOST}")))
    assert KEY not in exc_failure.message and HOST not in exc_failure.message


def test_missing_key_env_is_auth_and_names_only_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TR_UNIT_KEY")
    failure = failure_of(answer(200, completion({"role": "assistant", "content": "x"})))
    assert failure.error_class is ErrorClass.AUTH
    assert "TR_UNIT_KEY" in failure.message
