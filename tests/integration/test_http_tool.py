"""The `http` tool executor against a real tool server in a subprocess."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.domain.agent import ToolKind, ToolSpec
from app.domain.failures import ErrorClass, FailureError
from app.domain.transcript import ToolCall
from app.tools.base import ToolContext
from app.tools.execute import ToolRunner
from app.tools.http import HttpToolExecutor
from tests.processes import free_port
from tests.toolserver import start_tool_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with start_tool_server() as (base_url, _process):
        yield base_url


@pytest.fixture
def base_url(server: str) -> str:
    httpx.post(f"{server}/reset").raise_for_status()
    return server


def ctx(timeout_s: float = 5.0, call_id: str = "call_1") -> ToolContext:
    return ToolContext("turn_42", call_id, f"turn_42:{call_id}", timeout_s)


def call_tool(
    url: str,
    arguments: dict[str, Any] | None = None,
    timeout_s: float = 5.0,
    allowlist: frozenset[str] = frozenset(),
    call_id: str = "call_1",
) -> str:
    """One tool call through the runner's dispatcher, with a fresh executor."""
    spec = ToolSpec(name="remote", description="a remote tool", kind=ToolKind.HTTP, url=url)

    async def scenario() -> str:
        executor = HttpToolExecutor(allowlist=allowlist)
        try:
            call = ToolCall(call_id, "remote", arguments or {})
            return await ToolRunner(executor).run(spec, call, ctx(timeout_s, call_id))
        finally:
            await executor.aclose()

    return asyncio.run(scenario())


def failure(url: str, **kw: Any) -> FailureError:
    with pytest.raises(FailureError) as info:
        call_tool(url, **kw)
    assert "127.0.0.1" not in info.value.failure.message
    assert "http://" not in info.value.failure.message
    return info.value


def recorded(base_url: str) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = httpx.get(f"{base_url}/requests").json()
    return answer


def test_2xx_json_is_the_result_compactly(base_url: str) -> None:
    result = call_tool(f"{base_url}/echo", {"city": "Zürich", "days": 3})
    assert result == json.dumps(json.loads(result), separators=(",", ":"), ensure_ascii=False)
    answer = json.loads(result)
    assert answer["arguments"] == {"city": "Zürich", "days": 3}
    assert answer["turn_id"] == "turn_42"
    assert answer["tool_call_id"] == "call_1"


def test_headers_carry_the_idempotency_key_and_turn_id(base_url: str) -> None:
    call_tool(f"{base_url}/echo", {"n": 1}, call_id="call_7")
    call_tool(f"{base_url}/echo", {"n": 1}, call_id="call_7")  # a re-run after a crash
    seen = recorded(base_url)
    assert [r["idempotency_key"] for r in seen] == ["turn_42:call_7", "turn_42:call_7"]
    assert {r["turn_id"] for r in seen} == {"turn_42"}
    assert seen[0]["body"] == {
        "turn_id": "turn_42",
        "tool_call_id": "call_7",
        "arguments": {"n": 1},
    }


def test_plain_text_result_is_passed_through(base_url: str) -> None:
    assert call_tool(f"{base_url}/text", {"text": "  sunny, 21 °C "}) == "  sunny, 21 °C "


def test_503_is_tool_unavailable(base_url: str) -> None:
    f = failure(f"{base_url}/status/503").failure
    assert f.error_class is ErrorClass.TOOL_UNAVAILABLE
    assert f.http_status == 503
    assert f.retry_after_ms is None
    assert f.retryable()


def test_429_with_retry_after(base_url: str) -> None:
    f = failure(f"{base_url}/status/429?retry_after=3").failure
    assert f.error_class is ErrorClass.TOOL_UNAVAILABLE
    assert f.http_status == 429
    assert f.retry_after_ms == 3000


def test_408_is_tool_unavailable(base_url: str) -> None:
    assert failure(f"{base_url}/status/408").failure.error_class is ErrorClass.TOOL_UNAVAILABLE


def test_404_is_tool_failed_and_not_retryable(base_url: str) -> None:
    f = failure(f"{base_url}/status/404").failure
    assert f.error_class is ErrorClass.TOOL_FAILED
    assert f.http_status == 404
    assert not f.retryable()


def test_4xx_body_reaches_the_message(base_url: str) -> None:
    f = failure(f"{base_url}/status/422").failure
    assert f.message.startswith("tool answered HTTP 422")
    assert "status 422 on request" in f.message


def test_slow_tool_times_out_at_the_deadline(base_url: str) -> None:
    started = time.monotonic()
    f = failure(f"{base_url}/slow?ms=10000", timeout_s=0.3).failure
    assert f.error_class is ErrorClass.TOOL_TIMEOUT
    assert time.monotonic() - started < 5 * 0.3 + 1


def test_closed_port_is_tool_unavailable() -> None:
    f = failure(f"http://127.0.0.1:{free_port()}/echo").failure
    assert f.error_class is ErrorClass.TOOL_UNAVAILABLE
    assert f.http_status is None


def test_redirects_are_not_followed(base_url: str) -> None:
    f = failure(f"{base_url}/redirect").failure
    assert f.error_class is ErrorClass.TOOL_FAILED
    assert f.http_status == 302
    assert [r["path"] for r in recorded(base_url)] == ["/redirect"]


def test_flaky_tool_recovers_on_the_same_key(base_url: str) -> None:
    url = f"{base_url}/flaky?failures=1"
    assert failure(url).failure.error_class is ErrorClass.TOOL_UNAVAILABLE
    assert json.loads(call_tool(url, {"x": 1}))["idempotency_key"] == "turn_42:call_1"


def test_allowlist_refuses_before_sending(base_url: str) -> None:
    f = failure(f"{base_url}/echo", allowlist=frozenset({"tools.example.com"})).failure
    assert f.error_class is ErrorClass.TOOL_FAILED
    assert f.message == "destination not allowed"
    assert recorded(base_url) == []
    assert json.loads(call_tool(f"{base_url}/echo", allowlist=frozenset({"127.0.0.1"})))


def test_cancel_aborts_an_in_flight_request(base_url: str) -> None:
    spec = ToolSpec(
        name="remote", description="", kind=ToolKind.HTTP, url=f"{base_url}/slow?ms=10000"
    )

    async def scenario() -> float:
        executor = HttpToolExecutor()
        task = asyncio.create_task(
            ToolRunner(executor).run(spec, ToolCall("c", "remote", {}), ctx(timeout_s=30))
        )
        await asyncio.sleep(0.3)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await executor.aclose()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0
