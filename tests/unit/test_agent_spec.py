"""Agent definitions validated on the way in (API.md, Agents: ModelSpec, ToolSpec, Reply)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.domain.agent import (
    AgentSpec,
    ModelSpec,
    Provider,
    Reply,
    ToolKind,
    ToolSpec,
)
from app.domain.policy import ExecutionPolicy

SCRIPTED: dict[str, Any] = {"provider": "scripted", "model": "demo", "script": [{"content": "hi"}]}
OPENAI: dict[str, Any] = {"provider": "openai", "model": "gpt-4o-mini"}


def tool(**kw: Any) -> dict[str, Any]:
    return {"name": "calc", "description": "adds", "kind": "builtin", "builtin": "calculator", **kw}


def agent(**kw: Any) -> dict[str, Any]:
    return {"name": "demo", "model": SCRIPTED, **kw}


def errors(info: pytest.ExceptionInfo[ValidationError]) -> list[tuple[tuple[Any, ...], str]]:
    return [(tuple(e["loc"]), e["msg"]) for e in info.value.errors()]


# ---- valid specs ------------------------------------------------------------------------------


def test_valid_agent_with_every_tool_kind() -> None:
    spec = AgentSpec.model_validate(
        agent(
            description="d",
            system_prompt="be brief",
            tools=[
                tool(),
                {
                    "name": "lookup",
                    "description": "remote",
                    "kind": "http",
                    "url": "https://tools.example.com/lookup",
                    "timeout_ms": 500,
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string"}},
                        "required": ["q"],
                    },
                },
                {"name": "approve", "description": "human", "kind": "external"},
            ],
            execution_policy={"max_iterations": 3},
        )
    )
    assert [t.kind for t in spec.tools] == [ToolKind.BUILTIN, ToolKind.HTTP, ToolKind.EXTERNAL]
    assert spec.tool("lookup") is spec.tools[1]
    assert spec.tool("nope") is None
    assert spec.execution_policy == ExecutionPolicy(max_iterations=3)
    assert spec.model.provider is Provider.SCRIPTED
    assert spec.tools[2].parameters == {"type": "object"}


def test_valid_openai_model() -> None:
    m = ModelSpec.model_validate(
        {
            **OPENAI,
            "base_url": "http://127.0.0.1:8080/v1",
            "api_key_env": "OPENAI_API_KEY",
            "timeout_ms": 1000,
            "params": {"temperature": 0},
        }
    )
    assert m.provider is Provider.OPENAI
    assert m.script is None


@pytest.mark.parametrize(
    "url", ["http://tool.local/x", "https://example.com", "HTTPS://Example.com/a"]
)
def test_http_urls_accepted(url: str) -> None:
    assert ToolSpec.model_validate(tool(kind="http", url=url, builtin=None)).url == url


# ---- ToolSpec ---------------------------------------------------------------------------------


def test_http_tool_without_url() -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate({"name": "t", "description": "d", "kind": "http"})
    [(loc, msg)] = errors(info)
    assert loc == ()
    assert "url" in msg


def test_http_tool_without_url_inside_agent_names_the_tool() -> None:
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(
            agent(tools=[tool(), {"name": "t", "description": "d", "kind": "http"}])
        )
    [(loc, msg)] = errors(info)
    assert loc == ("tools", 1)
    assert "url" in msg


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/file",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/plain,hi",
        "gopher://example.com",
        "example.com/path",
        "http://",
        "http:///path-only",
        "",
    ],
)
def test_non_http_urls_refused(url: str) -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate(tool(kind="http", url=url, builtin=None))
    assert [loc for loc, _ in errors(info)] == [("url",)]


@pytest.mark.parametrize("url", ["ftp://example.com/v1", "file:///tmp/sock", "javascript:x"])
def test_model_base_url_must_be_http(url: str) -> None:
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate({**OPENAI, "base_url": url})
    assert [loc for loc, _ in errors(info)] == [("base_url",)]


@pytest.mark.parametrize("builtin", [None, ""])
def test_builtin_tool_without_builtin_name(builtin: str | None) -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate(tool(builtin=builtin))
    [(loc, msg)] = errors(info)
    assert loc == ()
    assert "builtin" in msg


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nonsense"},
        {"type": 5},
        {"type": "object", "properties": "x"},
        {"type": "object", "required": "q"},
        {"type": "object", "properties": {"q": {"minLength": -1}}},
    ],
)
def test_invalid_json_schema_in_parameters(schema: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate(tool(parameters=schema))
    [(loc, msg)] = errors(info)
    assert loc == ("parameters",)
    assert "JSON Schema" in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", ""), ("name", "has space"), ("name", "x" * 65), ("timeout_ms", 0), ("kind", "mcp")],
)
def test_tool_field_checks(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate(tool(**{field: value}))
    assert [loc[0] for loc, _ in errors(info)] == [field]


def test_tool_unknown_field_refused() -> None:
    with pytest.raises(ValidationError) as info:
        ToolSpec.model_validate(tool(endpoint="http://x"))
    assert [loc for loc, _ in errors(info)] == [("endpoint",)]


# ---- AgentSpec --------------------------------------------------------------------------------


def test_duplicate_tool_names_refused() -> None:
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(agent(tools=[tool(), tool(description="again")]))
    [(loc, msg)] = errors(info)
    assert loc == ()
    assert "unique" in msg


def test_distinct_tool_names_accepted() -> None:
    spec = AgentSpec.model_validate(agent(tools=[tool(), tool(name="calc2")]))
    assert [t.name for t in spec.tools] == ["calc", "calc2"]


@pytest.mark.parametrize("name", ["", "has space", "slash/name", "x" * 201])
def test_agent_name_checked(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(agent(name=name))
    assert [loc for loc, _ in errors(info)] == [("name",)]


def test_agent_policy_is_validated_with_nested_location() -> None:
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(agent(execution_policy={"retry": {"jitter": 2}}))
    assert [loc for loc, _ in errors(info)] == [("execution_policy", "retry", "jitter")]


def test_agent_unknown_field_refused() -> None:
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(agent(temperature=0.2))
    assert [loc for loc, _ in errors(info)] == [("temperature",)]


# ---- ModelSpec --------------------------------------------------------------------------------


@pytest.mark.parametrize("script", [None, []])
def test_scripted_without_script(script: list[Any] | None) -> None:
    body: dict[str, Any] = {"provider": "scripted", "model": "m"}
    if script is not None:
        body["script"] = script
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate(body)
    assert errors(info)
    assert all(loc in {(), ("script",)} for loc, _ in errors(info))


def test_openai_with_script_refused() -> None:
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate({**OPENAI, "script": [{"content": "x"}]})
    [(loc, msg)] = errors(info)
    assert loc == ()
    assert "script" in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("provider", "anthropic"),
        ("model", ""),
        ("api_key_env", "sk-live-123"),
        ("api_key_env", "1BAD"),
        ("timeout_ms", 0),
    ],
)
def test_model_field_checks(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate({**OPENAI, field: value})
    assert [loc for loc, _ in errors(info)] == [(field,)]


def test_model_api_key_field_does_not_exist() -> None:
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate({**OPENAI, "api_key": "sk-secret"})
    assert [loc for loc, _ in errors(info)] == [("api_key",)]


# ---- Reply ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"content": "hello"},
        {"content": ""},
        {"tool_calls": [{"name": "calc", "arguments": {"expr": "1+1"}}]},
        {"tool_calls": [{"name": "calc"}]},
        {"error": {"status": 429, "code": "rate_limit_exceeded", "retry_after_ms": 100}},
        {"error": {"status": 500}},
        {"hang_ms": 0},
        {"hang_ms": 1000, "usage": {"input_tokens": 5, "output_tokens": 7}},
        {"content": "x", "usage": {"input_tokens": 1}},
    ],
)
def test_reply_with_exactly_one_kind_is_valid(body: dict[str, Any]) -> None:
    Reply.model_validate(body)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"usage": {"input_tokens": 1}},
        {"content": "a", "tool_calls": [{"name": "calc"}]},
        {"content": "a", "error": {"status": 500}},
        {"content": "a", "hang_ms": 10},
        {"tool_calls": [{"name": "calc"}], "error": {"status": 500}},
        {"error": {"status": 500}, "hang_ms": 10},
        {"content": "a", "tool_calls": [{"name": "calc"}], "error": {"status": 500}, "hang_ms": 1},
    ],
)
def test_reply_needs_exactly_one_of_content_tool_calls_error_hang(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        Reply.model_validate(body)
    [(loc, msg)] = errors(info)
    assert loc == ()
    assert "exactly one" in msg


def test_reply_empty_tool_calls_refused() -> None:
    with pytest.raises(ValidationError) as info:
        Reply.model_validate({"tool_calls": []})
    assert "must not be empty" in errors(info)[0][1]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"error": {"status": 200}}, ("error", "status")),
        ({"error": {"status": 600}}, ("error", "status")),
        ({"error": {"status": 500, "retry_after_ms": -1}}, ("error", "retry_after_ms")),
        ({"hang_ms": -1}, ("hang_ms",)),
        ({"content": "x", "usage": {"input_tokens": -1}}, ("usage", "input_tokens")),
        ({"content": "x", "extra": 1}, ("extra",)),
        ({"tool_calls": [{"name": ""}]}, ("tool_calls", 0, "name")),
    ],
)
def test_reply_field_checks(body: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        Reply.model_validate(body)
    assert loc in [loc_ for loc_, _ in errors(info)]


def test_scripted_model_with_a_bad_reply_names_its_index() -> None:
    with pytest.raises(ValidationError) as info:
        ModelSpec.model_validate(
            {"provider": "scripted", "model": "m", "script": [{"content": "ok"}, {}]}
        )
    assert [loc for loc, _ in errors(info)] == [("script", 1)]
