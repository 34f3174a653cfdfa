"""The fake model server as a real process, driven by the OpenAI provider over real HTTP."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from app.domain.agent import ModelSpec, ToolSpec
from app.domain.failures import ErrorClass, Failure, FailureError
from app.domain.transcript import Message
from app.models.base import ModelReply, ModelRequest
from app.models.openai import OpenAIProvider
from tests.conftest import free_port, run_process

CALCULATOR = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
    kind="builtin",
    builtin="calculator",
)


@dataclass
class FakeLLM:
    """A running fake-llm process: its base URL and a client for its control API."""

    root: str
    control: httpx.Client

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def script(self, model: str, replies: list[dict[str, Any]]) -> None:
        self.control.put(f"/_control/models/{model}", json={"replies": replies}).raise_for_status()

    def faults(self, model: str, **body: Any) -> None:
        self.control.put(f"/_control/models/{model}/faults", json=body).raise_for_status()

    def stats(self, model: str) -> dict[str, Any]:
        response = self.control.get(f"/_control/models/{model}")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data


@pytest.fixture(scope="module")
def fake_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeLLM]:
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fake_llm") / "server.log"
    with (
        run_process(["fake-llm", "--port", str(port)], {}, log, root + "/healthz"),
        httpx.Client(base_url=root, timeout=10) as control,
    ):
        yield FakeLLM(root, control)


@pytest.fixture
def model() -> str:
    """A model name of its own per test, so the fake's per-model state never leaks between tests."""
    return f"test-{uuid.uuid4().hex[:12]}"


def request_for(
    base_url: str,
    model: str,
    *,
    messages: list[Message] | None = None,
    tools: list[ToolSpec] | None = None,
    timeout_s: float = 10.0,
) -> ModelRequest:
    spec = ModelSpec(provider="openai", model=model, base_url=base_url)
    return ModelRequest(
        spec=spec,
        messages=messages or [Message(role="user", content="hello there")],
        tools=tools or [],
        call_index=0,
        timeout_s=timeout_s,
        turn_id="turn_e2e",
    )


def complete(request: ModelRequest) -> ModelReply:
    async def go() -> ModelReply:
        provider = OpenAIProvider()
        try:
            return await provider.complete(request)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def fail(request: ModelRequest) -> Failure:
    with pytest.raises(FailureError) as info:
        complete(request)
    return info.value.failure


def raw_chat(fake: FakeLLM, body: dict[str, Any]) -> httpx.Response:
    return fake.control.post("/v1/chat/completions", json=body)


def test_default_echo(fake_llm: FakeLLM, model: str) -> None:
    reply = complete(request_for(fake_llm.base_url, model))
    assert reply.content == "echo: hello there"
    assert reply.tool_calls == []
    assert (reply.input_tokens, reply.output_tokens) == (2, 3)


def test_default_tool_call_then_result(fake_llm: FakeLLM, model: str) -> None:
    first = complete(request_for(fake_llm.base_url, model, tools=[CALCULATOR]))
    assert first.content is None
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("calculator", {"expression": "6*7"})
    ]
    call = first.tool_calls[0]
    assert call.id.startswith("call_")
    messages = [
        Message(role="user", content="what is 6*7?"),
        Message(role="assistant", content=None, tool_calls=(call,)),
        Message(role="tool", content="42", tool_call_id=call.id),
    ]
    second = complete(request_for(fake_llm.base_url, model, messages=messages, tools=[CALCULATOR]))
    assert second.content == "result: 42"
    assert second.tool_calls == []
    assert fake_llm.stats(model)["message_counts"] == [1, 3]


def test_other_tools_get_empty_arguments(fake_llm: FakeLLM, model: str) -> None:
    clock = ToolSpec(name="current_time", description="now", kind="builtin", builtin="current_time")
    reply = complete(request_for(fake_llm.base_url, model, tools=[clock, CALCULATOR]))
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("current_time", {})]


def test_scripted_replies_in_order_and_last_repeats(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(
        model,
        [
            {
                "tool_calls": [{"name": "calculator", "arguments": {"expression": "1+1"}}],
                "usage": {"input_tokens": 100, "output_tokens": 7},
            },
            {"content": "two"},
        ],
    )
    request = request_for(fake_llm.base_url, model)
    first = complete(request)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("calculator", {"expression": "1+1"})
    ]
    assert (first.input_tokens, first.output_tokens) == (100, 7)
    assert complete(request).content == "two"
    assert complete(request).content == "two"
    assert fake_llm.stats(model)["requests"] == 3


def test_rate_limited_with_retry_after(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(
        model, [{"error": {"status": 429, "code": "rate_limit_exceeded", "retry_after_ms": 1500}}]
    )
    failure = fail(request_for(fake_llm.base_url, model))
    assert failure.error_class is ErrorClass.RATE_LIMITED
    assert failure.http_status == 429
    assert failure.code == "rate_limit_exceeded"
    assert failure.retry_after_ms == 2000  # Retry-After is whole seconds, rounded up
    assert failure.retryable()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"status": 503}, ErrorClass.OVERLOADED),
        ({"status": 529}, ErrorClass.OVERLOADED),
        ({"status": 500}, ErrorClass.SERVER_ERROR),
        ({"status": 502}, ErrorClass.SERVER_ERROR),
        ({"status": 401, "code": "invalid_api_key"}, ErrorClass.AUTH),
        ({"status": 403}, ErrorClass.AUTH),
        ({"status": 400, "code": "context_length_exceeded"}, ErrorClass.CONTEXT_LENGTH_EXCEEDED),
        ({"status": 429, "code": "insufficient_quota"}, ErrorClass.QUOTA_EXCEEDED),
        ({"status": 400, "message": "temperature must be <= 2"}, ErrorClass.BAD_REQUEST),
        ({"status": 404, "code": "model_not_found"}, ErrorClass.BAD_REQUEST),
    ],
)
def test_error_statuses_are_classified(
    fake_llm: FakeLLM, model: str, error: dict[str, Any], expected: ErrorClass
) -> None:
    fake_llm.script(model, [{"error": error}])
    failure = fail(request_for(fake_llm.base_url, model))
    assert failure.error_class is expected
    assert failure.http_status == error["status"]
    assert failure.retry_after_ms is None
    assert "127.0.0.1" not in failure.message


def test_error_message_reaches_the_failure(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"error": {"status": 400, "message": "temperature must be <= 2"}}])
    assert "temperature must be <= 2" in fail(request_for(fake_llm.base_url, model)).message


def test_malformed_body_is_invalid_response(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"malformed": True}])
    failure = fail(request_for(fake_llm.base_url, model))
    assert failure.error_class is ErrorClass.INVALID_RESPONSE
    assert not failure.retryable()


def test_bad_arguments_are_invalid_response(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"bad_arguments": True}])
    failure = fail(request_for(fake_llm.base_url, model, tools=[CALCULATOR]))
    assert failure.error_class is ErrorClass.INVALID_RESPONSE
    assert "calculator" in failure.message


def test_hang_past_the_timeout_is_timeout(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"hang_ms": 3000}])
    started = time.monotonic()
    failure = fail(request_for(fake_llm.base_url, model, timeout_s=0.3))
    assert failure.error_class is ErrorClass.TIMEOUT
    assert time.monotonic() - started < 2.5
    assert failure.retryable()


def test_short_hang_answers_normally(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"hang_ms": 50}])
    assert complete(request_for(fake_llm.base_url, model)).content == "echo: hello there"


def test_connection_refused_is_connection() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there any more
    failure = fail(request_for(base_url, "any-model", timeout_s=5))
    assert failure.error_class is ErrorClass.CONNECTION
    assert failure.retryable()
    assert "127.0.0.1" not in failure.message


def test_fault_queue_then_normal(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.faults(
        model,
        faults=[{"status": 503, "count": 2}, {"status": 429, "count": 1, "retry_after_ms": 200}],
    )
    fake_llm.script(model, [{"content": "first scripted"}, {"content": "second scripted"}])
    request = request_for(fake_llm.base_url, model)
    assert fail(request).error_class is ErrorClass.OVERLOADED
    assert fail(request).error_class is ErrorClass.OVERLOADED
    limited = fail(request)
    assert (limited.error_class, limited.retry_after_ms) == (ErrorClass.RATE_LIMITED, 1000)
    # Faulted requests do not use up scripted replies.
    assert complete(request).content == "first scripted"
    stats = fake_llm.stats(model)
    assert (stats["requests"], stats["faults_pending"], stats["replies_served"]) == (4, 0, 1)


def test_fault_rate_is_seeded(fake_llm: FakeLLM, model: str) -> None:
    def pattern() -> list[int]:
        fake_llm.faults(model, fault_rate=0.5, fault_status=502, seed=42)
        body = {"model": model, "messages": [{"role": "user", "content": "x"}]}
        return [raw_chat(fake_llm, body).status_code for _ in range(30)]

    first, second = pattern(), pattern()
    assert first == second
    assert set(first) == {200, 502}


def test_reset_and_stats(fake_llm: FakeLLM, model: str) -> None:
    assert fake_llm.stats(model)["requests"] == 0
    fake_llm.script(model, [{"content": "scripted"}])
    complete(request_for(fake_llm.base_url, model))
    assert fake_llm.stats(model)["requests"] == 1
    assert fake_llm.control.delete(f"/_control/models/{model}").status_code == 204
    assert fake_llm.stats(model)["requests"] == 0
    assert complete(request_for(fake_llm.base_url, model)).content == "echo: hello there"


def test_models_are_isolated(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"content": "mine"}])
    other = model + "-other"
    assert complete(request_for(fake_llm.base_url, other)).content == "echo: hello there"
    assert complete(request_for(fake_llm.base_url, model)).content == "mine"


def test_model_names_with_slashes(fake_llm: FakeLLM) -> None:
    name = f"org/{uuid.uuid4().hex[:8]}"
    fake_llm.script(name, [{"content": "slashed"}])
    fake_llm.faults(name, faults=[{"status": 500, "count": 1}])
    assert fail(request_for(fake_llm.base_url, name)).error_class is ErrorClass.SERVER_ERROR
    assert complete(request_for(fake_llm.base_url, name)).content == "slashed"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("", {"replies": []}),
        ("", {"replies": [{"content": "a", "hang_ms": 5}]}),
        ("", {"replies": [{}]}),
        ("", {"replies": [{"error": {"status": 200}}]}),
        ("", {"replies": [{"malformed": False}]}),
        ("", {"replies": [{"content": "a", "surprise": 1}]}),
        ("/faults", {"faults": [{"status": 200, "count": 1}]}),
        ("/faults", {"faults": [{"status": 503, "count": 0}]}),
        ("/faults", {"fault_rate": 1.5}),
    ],
)
def test_bad_control_bodies_are_422(
    fake_llm: FakeLLM, model: str, path: str, body: dict[str, Any]
) -> None:
    assert fake_llm.control.put(f"/_control/models/{model}{path}", json=body).status_code == 422


def test_bad_chat_request_is_an_openai_error(fake_llm: FakeLLM) -> None:
    response = raw_chat(fake_llm, {"messages": "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_raw_responses_validate_as_openai_types(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(
        model,
        [
            {"content": "plain"},
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+2"}}]},
            {"bad_arguments": True},
            {"hang_ms": 1},
        ],
    )
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    finish = []
    for _ in range(4):
        response = raw_chat(fake_llm, body)
        assert response.status_code == 200
        parsed = ChatCompletion.model_validate(response.json())
        assert parsed.model == model and parsed.usage is not None
        assert parsed.usage.total_tokens == (
            parsed.usage.prompt_tokens + parsed.usage.completion_tokens
        )
        finish.append(parsed.choices[0].finish_reason)
    assert finish == ["stop", "tool_calls", "tool_calls", "tool_calls"]


def test_error_body_has_openai_shape(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(
        model, [{"error": {"status": 429, "code": "rate_limit_exceeded", "retry_after_ms": 2001}}]
    )
    response = raw_chat(fake_llm, {"model": model, "messages": []})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "rate_limit_exceeded" and error["param"] is None


def test_official_openai_client(fake_llm: FakeLLM, model: str) -> None:
    client = openai.OpenAI(base_url=fake_llm.base_url, api_key="x", max_retries=0)
    try:
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi from openai"}]
        )
        assert chat.choices[0].message.content == "echo: hi from openai"
        with_tool = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "compute"}],
            tools=[{"type": "function", "function": {"name": "calculator", "parameters": {}}}],
        )
        tool_calls = with_tool.choices[0].message.tool_calls or []
        assert [c.function.name for c in tool_calls if c.type == "function"] == ["calculator"]
        fake_llm.script(model, [{"error": {"status": 429, "code": "rate_limit_exceeded"}}])
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    finally:
        client.close()


def test_models_listing_and_health(fake_llm: FakeLLM, model: str) -> None:
    fake_llm.script(model, [{"content": "x"}])
    ids = [m["id"] for m in fake_llm.control.get("/v1/models").json()["data"]]
    assert model in ids
    assert fake_llm.control.get("/healthz").status_code == 200


def test_tool_call_round_trip_ids_are_deterministic(fake_llm: FakeLLM, model: str) -> None:
    request = request_for(fake_llm.base_url, model, tools=[CALCULATOR])
    ids = [complete(request).tool_calls[0].id for _ in range(2)]
    assert ids == ["call_1", "call_2"]
