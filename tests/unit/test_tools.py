"""Tools without a network: builtins, argument validation, timeouts, cancel and the URL guard."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.agent import ToolKind, ToolSpec
from app.domain.failures import ErrorClass, FailureError
from app.domain.retry_after import parse_retry_after
from app.domain.transcript import ToolCall
from app.tools import registry
from app.tools.base import ToolContext
from app.tools.builtins import BUILTIN_SCHEMAS, CalculatorError, calculator
from app.tools.execute import ToolRunner, to_content, validate_arguments
from app.tools.guard import check_url, forbidden_address
from app.tools.http import HttpToolExecutor

ROOT = Path(__file__).resolve().parents[2]


def ctx(timeout_s: float = 5.0, call_id: str = "call_1") -> ToolContext:
    return ToolContext("turn_1", call_id, f"turn_1:{call_id}", timeout_s)


def builtin(name: str, parameters: dict[str, Any] | None = None) -> ToolSpec:
    schema = BUILTIN_SCHEMAS.get(name, {"description": name, "parameters": {"type": "object"}})
    return ToolSpec(
        name=name,
        description=schema["description"],
        parameters=parameters if parameters is not None else schema["parameters"],
        kind=ToolKind.BUILTIN,
        builtin=name,
    )


def http_tool(url: str) -> ToolSpec:
    return ToolSpec(name="remote", description="remote", kind=ToolKind.HTTP, url=url)


def run_tool(
    spec: ToolSpec | None,
    arguments: dict[str, Any],
    context: ToolContext | None = None,
    runner: ToolRunner | None = None,
    raw: str | None = None,
) -> str:
    call = ToolCall("call_1", spec.name if spec else "nope", arguments, raw)
    return asyncio.run((runner or ToolRunner(HttpToolExecutor())).run(spec, call, context or ctx()))


def failure_of(spec: ToolSpec | None, arguments: dict[str, Any], **kw: Any) -> FailureError:
    with pytest.raises(FailureError) as info:
        run_tool(spec, arguments, **kw)
    return info.value


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Register test builtins under given names; unregister them afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister_builtin(name)


def register(names: list[str], name: str, fn: registry.BuiltinTool) -> ToolSpec:
    registry.register_builtin(name, fn)
    names.append(name)
    return builtin(name)


# --- calculator -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("8 / 4", 2),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-(3 - 5)", 2),
        ("+4", 4),
        ("1.5e3 + 0.25", 1500.25),
        ("  12  ", 12),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: float) -> None:
    result = calculator({"expression": expression}, ctx())
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9**9**9", "exponent too large"),
        ("10 ** 100000", "exponent too large"),
        ("2 ** 4097", "exponent too large"),
        ("(2 ** 2000) * (2 ** 2000) * (2 ** 2000)", "result too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("10.0 ** 400", "result too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("__import__('os').system('true')", "only numbers"),
        ("x + 1", "only numbers"),
        ("abs(-1)", "only numbers"),
        ("(1).real", "only numbers"),
        ("True + 1", "only numbers"),
        ("'a' * 3", "only numbers"),
        ("1j * 2", "only numbers"),
        ("1 << 100", "only numbers"),
        ("1 < 2", "only numbers"),
        ("1 +", "not a valid arithmetic expression"),
        ("1; 2", "not a valid arithmetic expression"),
        ("1" + " + 1" * 600, "longer than"),
    ],
)
def test_calculator_refuses(expression: str, reason: str) -> None:
    started = time.monotonic()
    with pytest.raises(CalculatorError, match=reason):
        calculator({"expression": expression}, ctx())
    assert time.monotonic() - started < 2  # refused up front, not computed


def test_calculator_through_the_runner_returns_json_text() -> None:
    assert run_tool(builtin("calculator"), {"expression": "6 * 7"}) == "42"
    assert run_tool(builtin("calculator"), {"expression": "1 / 4"}) == "0.25"


def test_calculator_refusal_is_tool_failed_with_a_clear_message() -> None:
    failure = failure_of(builtin("calculator"), {"expression": "9**9**9"}).failure
    assert failure.error_class is ErrorClass.TOOL_FAILED
    assert failure.message == "exponent too large"
    assert "Traceback" not in failure.message


# --- current_time and sleep -------------------------------------------------------------------


def test_current_time_defaults_to_utc_and_honours_a_zone() -> None:
    utc = run_tool(builtin("current_time"), {})
    assert utc.endswith("+00:00")
    tokyo = run_tool(builtin("current_time"), {"timezone": "Asia/Tokyo"})
    assert tokyo.endswith("+09:00")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime"])
def test_current_time_unknown_zone_is_tool_failed(zone: str) -> None:
    failure = failure_of(builtin("current_time"), {"timezone": zone}).failure
    assert failure.error_class is ErrorClass.TOOL_FAILED
    assert "unknown time zone" in failure.message


def test_sleep_returns_what_it_slept() -> None:
    assert json.loads(run_tool(builtin("sleep"), {"ms": 1})) == {"slept_ms": 1}


def test_async_builtin_times_out_at_the_deadline() -> None:
    started = time.monotonic()
    failure = failure_of(builtin("sleep"), {"ms": 60_000}, context=ctx(timeout_s=0.2)).failure
    assert failure.error_class is ErrorClass.TOOL_TIMEOUT
    assert time.monotonic() - started < 10.0  # returned at the deadline, not after 60 s


def test_cancel_aborts_an_async_builtin_and_propagates() -> None:
    async def scenario() -> float:
        runner = ToolRunner(HttpToolExecutor())
        call = ToolCall("call_1", "sleep", {"ms": 60_000})
        task = asyncio.create_task(runner.run(builtin("sleep"), call, ctx(timeout_s=60)))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0


# --- sync builtins on daemon threads ----------------------------------------------------------


def test_hung_sync_builtin_times_out_while_its_thread_hangs(registered: list[str]) -> None:
    release = threading.Event()
    entered = threading.Event()

    def hang(arguments: dict[str, Any], context: ToolContext) -> str:
        entered.set()
        release.wait(30)
        return "too late"

    spec = register(registered, "hang", hang)
    timeout_s = 0.3
    started = time.monotonic()
    try:
        failure = failure_of(spec, {}, context=ctx(timeout_s=timeout_s)).failure
        elapsed = time.monotonic() - started
        assert entered.is_set()  # it really ran, and is still hanging now
        assert not release.is_set()
    finally:
        release.set()
    assert failure.error_class is ErrorClass.TOOL_TIMEOUT
    assert elapsed < 5 * timeout_s


def test_cancel_returns_at_once_while_a_sync_builtin_hangs(registered: list[str]) -> None:
    release = threading.Event()
    spec = register(registered, "hang", lambda arguments, context: release.wait(30))

    async def scenario() -> float:
        task = asyncio.create_task(
            ToolRunner(HttpToolExecutor()).run(spec, ToolCall("c", "hang", {}), ctx(60))
        )
        await asyncio.sleep(0.05)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    try:
        assert asyncio.run(scenario()) < 1.0
    finally:
        release.set()


def test_process_exits_while_a_sync_builtin_thread_hangs() -> None:
    # concurrent.futures' executors join their threads at exit; this process would never end.
    script = textwrap.dedent(
        """
        import asyncio, time
        from app.domain.agent import ToolSpec
        from app.domain.failures import FailureError
        from app.domain.transcript import ToolCall
        from app.tools import registry
        from app.tools.base import ToolContext
        from app.tools.execute import ToolRunner
        from app.tools.http import HttpToolExecutor

        registry.register_builtin("hang", lambda a, c: time.sleep(3600))
        spec = ToolSpec(name="hang", description="", kind="builtin", builtin="hang")
        context = ToolContext("t", "c", "t:c", 0.2)
        try:
            runner = ToolRunner(HttpToolExecutor())
            asyncio.run(runner.run(spec, ToolCall("c", "hang", {}), context))
        except FailureError as e:
            print(e.failure.error_class.value, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tool_timeout"


def test_builtin_exception_is_tool_failed_without_traceback_or_host(registered: list[str]) -> None:
    def broken(arguments: dict[str, Any], context: ToolContext) -> None:
        raise RuntimeError("backend at http://10.1.2.3:5432/db refused")

    failure = failure_of(register(registered, "broken", broken), {}).failure
    assert failure.error_class is ErrorClass.TOOL_FAILED
    assert "10.1.2.3" not in failure.message
    assert "refused" in failure.message
    assert "Traceback" not in failure.message


def test_builtin_own_timeout_error_is_not_a_deadline(registered: list[str]) -> None:
    async def gives_up(arguments: dict[str, Any], context: ToolContext) -> None:
        raise TimeoutError("upstream gave up")

    failure = failure_of(register(registered, "gives_up", gives_up), {}).failure
    assert failure.error_class is ErrorClass.TOOL_FAILED
    assert failure.message == "upstream gave up"


def test_builtin_sees_its_idempotency_key(registered: list[str]) -> None:
    spec = register(registered, "key", lambda arguments, context: context.idempotency_key)
    assert run_tool(spec, {}, context=ctx(call_id="call_9")) == "turn_1:call_9"


def test_results_are_serialized_as_json_unless_already_text() -> None:
    assert to_content("plain") == "plain"
    assert json.loads(to_content({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}
    assert to_content({"when": Path("/x")}) == '{"when": "/x"}'  # default=str
    with pytest.raises(FailureError) as info:
        to_content(float("nan"))
    assert info.value.failure.error_class is ErrorClass.TOOL_FAILED


# --- validation and dispatch ------------------------------------------------------------------


def test_arguments_are_validated_before_the_tool_runs(registered: list[str]) -> None:
    calls: list[dict[str, Any]] = []
    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["x"],
    }
    registry.register_builtin("record", lambda arguments, context: calls.append(arguments))
    registered.append("record")
    spec = builtin("record", parameters=schema)

    failure = failure_of(spec, {"x": "x"}).failure
    assert failure.error_class is ErrorClass.INVALID_ARGUMENTS
    assert failure.message == "arguments.x: 'x' is not of type 'number'"

    message = failure_of(spec, {"x": 1, "tags": ["a", 2]}).failure.message
    assert message == "arguments.tags[1]: 2 is not of type 'string'"

    message = failure_of(spec, {}).failure.message
    assert message == "arguments: 'x' is a required property"

    assert calls == []
    run_tool(spec, {"x": 1})
    assert calls == [{"x": 1}]


def test_calculator_schema_rejects_a_number_expression() -> None:
    failure = failure_of(builtin("calculator"), {"expression": 5}).failure
    assert failure.error_class is ErrorClass.INVALID_ARGUMENTS
    assert failure.message == "arguments.expression: 5 is not of type 'string'"


def test_non_json_arguments_are_invalid_and_not_echoed() -> None:
    call = ToolCall("call_1", "calculator", {}, raw_arguments="{'expression': SECRET")
    with pytest.raises(FailureError) as info:
        validate_arguments(builtin("calculator"), call)
    assert info.value.failure.error_class is ErrorClass.INVALID_ARGUMENTS
    assert "SECRET" not in info.value.failure.message


def test_unknown_tool_and_unknown_builtin_are_tool_not_found() -> None:
    failure = failure_of(None, {}).failure
    assert failure.error_class is ErrorClass.TOOL_NOT_FOUND
    assert failure.message == "unknown tool nope"

    missing = ToolSpec(name="ghost", description="", kind=ToolKind.BUILTIN, builtin="no_such_tool")
    assert failure_of(missing, {}).failure.error_class is ErrorClass.TOOL_NOT_FOUND


def test_external_tools_are_not_executed_here() -> None:
    spec = ToolSpec(name="ask", description="", kind=ToolKind.EXTERNAL)
    with pytest.raises(ValueError, match="external"):
        run_tool(spec, {})


def test_no_time_left_is_a_timeout_without_running(registered: list[str]) -> None:
    calls: list[int] = []
    spec = register(registered, "count", lambda arguments, context: calls.append(1))
    failure = failure_of(spec, {}, context=ctx(timeout_s=0)).failure
    assert failure.error_class is ErrorClass.TOOL_TIMEOUT
    assert calls == []


# --- registry ---------------------------------------------------------------------------------


def test_registry_loads_the_shipped_builtins_from_entry_points() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert {"calculator", "current_time", "sleep"} <= names
    assert registry.get_builtin("calculator") is calculator
    assert {"calculator", "current_time", "sleep"} <= set(registry.builtin_names())
    assert registry.get_builtin("no_such_tool") is None
    assert set(BUILTIN_SCHEMAS) == {"calculator", "current_time", "sleep"}


def test_programmatic_registration_overrides_and_can_be_removed() -> None:
    def fake(arguments: dict[str, Any], context: ToolContext) -> str:
        return "fake"

    registry.register_builtin("calculator", fake)
    try:
        assert registry.get_builtin("calculator") is fake
    finally:
        registry.unregister_builtin("calculator")
    assert registry.get_builtin("calculator") is calculator


# --- URL guard --------------------------------------------------------------------------------


def refused(url: str, allowlist: frozenset[str] = frozenset()) -> FailureError:
    with pytest.raises(FailureError) as info:
        asyncio.run(check_url(url, allowlist))
    return info.value


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.1/",
        "http://[fe80::1]/",
        "http://[fe80::1%25eth0]:8080/",
        "http://[fd00:ec2::254]/",
        "http://100.100.100.200/",
        "http://[::ffff:169.254.169.254]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://224.0.0.1/",
        "http://0.0.0.0:8080/",
        "http://[::]/",
        "http://240.0.0.1/",
        "ftp://example.com/",
        "http:///nohost",
        "http://example.com:99999/",
    ],
)
def test_guard_refuses_forbidden_destinations(url: str) -> None:
    failure = refused(url).failure
    assert failure.error_class is ErrorClass.TOOL_FAILED
    assert failure.message == "destination not allowed"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://[::1]/",
        "http://10.0.0.5/",
        "http://192.168.1.1/",
        "http://[fd12::1]/",
        "http://[::ffff:127.0.0.1]/",
    ],
)
def test_guard_allows_loopback_and_private(url: str) -> None:
    asyncio.run(check_url(url, frozenset()))


def test_guard_allowlist_is_exact_and_case_insensitive() -> None:
    failure = refused("http://127.0.0.1:9/", frozenset({"localhost"})).failure
    assert failure.message == "destination not allowed"
    assert "127.0.0.1" not in str(failure.to_json())
    assert refused("http://evil.localhost./", frozenset({"localhost"})).failure.message == (
        "destination not allowed"
    )
    asyncio.run(check_url("http://LOCALHOST./x", frozenset({"localhost"})))
    asyncio.run(check_url("http://127.0.0.1:9/", frozenset({"127.0.0.1"})))


def fake_dns(answers: dict[str, list[str]]) -> Any:
    async def getaddrinfo(host: str, port: int, **kw: Any) -> list[Any]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    return getaddrinfo


def test_guard_judges_every_resolved_address() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.getaddrinfo = fake_dns(  # type: ignore[method-assign]
            {"tools.example": ["10.0.0.7"], "sneaky.example": ["10.0.0.7", "169.254.169.254"]}
        )
        await check_url("https://tools.example/run", frozenset())
        with pytest.raises(FailureError) as info:
            await check_url("https://sneaky.example/run", frozenset())
        assert info.value.failure.message == "destination not allowed"
        with pytest.raises(FailureError) as info:
            await check_url("https://gone.example/run", frozenset())
        assert info.value.failure.error_class is ErrorClass.TOOL_UNAVAILABLE
        assert "gone.example" not in info.value.failure.message

    asyncio.run(scenario())


def test_forbidden_address_table() -> None:
    from ipaddress import ip_address

    assert forbidden_address(ip_address("169.254.169.254"))
    assert forbidden_address(ip_address("2002:a9fe:a9fe::1"))  # 6to4 wrapping link-local
    assert not forbidden_address(ip_address("8.8.8.8"))
    assert not forbidden_address(ip_address("2606:4700::1111"))


def test_refused_http_tool_sends_nothing() -> None:
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"ok": True})

    async def scenario() -> list[ErrorClass]:
        classes = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
            runner = ToolRunner(HttpToolExecutor(client, allowlist=frozenset({"tools.internal"})))
            for url in ("http://169.254.169.254/latest", "http://[fe80::1]/x", "http://10.0.0.1/"):
                with pytest.raises(FailureError) as info:
                    await runner.run(http_tool(url), ToolCall("c", "remote", {}), ctx())
                classes.append(info.value.failure.error_class)
                assert "169.254" not in info.value.failure.message
                assert "10.0.0.1" not in info.value.failure.message
        return classes

    assert asyncio.run(scenario()) == [ErrorClass.TOOL_FAILED] * 3
    assert sent == []


def test_http_tool_request_shape_with_a_mock_transport() -> None:
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"answer": 42, "text": "é"})

    async def scenario() -> str:
        async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
            executor = HttpToolExecutor(client)
            return await executor.execute(http_tool("http://127.0.0.1:9/run"), {"q": 1}, ctx())

    assert asyncio.run(scenario()) == '{"answer":42,"text":"é"}'
    (request,) = sent
    assert request.method == "POST"
    assert request.headers["Idempotency-Key"] == "turn_1:call_1"
    assert request.headers["X-Turn-Id"] == "turn_1"
    body = json.loads(request.content)
    assert body == {"turn_id": "turn_1", "tool_call_id": "call_1", "arguments": {"q": 1}}


def test_parse_retry_after() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after({"Retry-After": "2"}) == 2000
    assert parse_retry_after({"Retry-After": "0.5"}) == 500
    assert parse_retry_after({"Retry-After": "-1"}) is None
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0  # in the past
