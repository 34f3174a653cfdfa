"""Agents over HTTP on both databases: create and version, read, list, and validation (API.md)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import CALCULATOR, create_agent, scripted

EXTERNAL = {
    "name": "lookup",
    "description": "Look something up.",
    "kind": "external",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
HTTP_TOOL = {
    "name": "remote",
    "description": "A remote tool.",
    "kind": "http",
    "url": "https://tools.example.com/remote",
    "timeout_ms": 5000,
}


def _body(name: str = "alpha", **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": scripted({"content": "hello"}), "tools": [], **extra}


def test_create_versions_get_and_list(api_only: Any) -> None:
    policy = {"max_iterations": 7, "retry": {"max_retries": 3}}
    v1 = create_agent(
        api_only,
        "alpha",
        scripted({"content": "one"}),
        tools=[CALCULATOR],
        policy=policy,
        description="first",
        system_prompt="be brief",
    )
    assert v1["name"] == "alpha"
    assert v1["version"] == 1
    assert v1["description"] == "first"
    assert v1["system_prompt"] == "be brief"
    assert v1["model"]["provider"] == "scripted"
    assert [reply["content"] for reply in v1["model"]["script"]] == ["one"]
    assert [t["name"] for t in v1["tools"]] == ["calculator"]
    assert v1["tools"][0]["builtin"] == "calculator"
    assert v1["execution_policy"]["max_iterations"] == 7
    assert v1["execution_policy"]["retry"]["max_retries"] == 3
    assert v1["created_at"]

    r = api_only.post(
        "/v1/agents", json=_body("alpha", tools=[EXTERNAL, HTTP_TOOL], description="second")
    )
    assert r.status_code == 201, r.text
    v2 = r.json()
    assert v2["version"] == 2
    assert [t["name"] for t in v2["tools"]] == ["lookup", "remote"]
    assert v2["tools"][1]["url"] == "https://tools.example.com/remote"

    latest = api_only.get("/v1/agents/alpha")
    assert latest.status_code == 200
    assert latest.json()["version"] == 2
    assert latest.json()["description"] == "second"

    first = api_only.get("/v1/agents/alpha", params={"version": 1})
    assert first.status_code == 200
    assert first.json()["version"] == 1
    assert first.json()["description"] == "first"
    assert first.json()["execution_policy"]["retry"]["max_retries"] == 3
    assert first.json() == v1

    create_agent(api_only, "beta", scripted({"content": "b"}))
    listed = api_only.get("/v1/agents")
    assert listed.status_code == 200
    items = listed.json()["items"]
    assert [(a["name"], a["version"]) for a in items] == [("alpha", 2), ("beta", 1)]


def test_unknown_agent_and_version_are_404(api_only: Any) -> None:
    r = api_only.get("/v1/agents/nobody")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "not_found"

    create_agent(api_only, "alpha", scripted({"content": "x"}))
    r = api_only.get("/v1/agents/alpha", params={"version": 2})
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"
    for bad in ("0", "-1", "x", str(10**20)):
        r = api_only.get("/v1/agents/alpha", params={"version": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["code"] == "validation_error"


def _tool(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        tool = {**copy.deepcopy(HTTP_TOOL), **changes}
        body["tools"] = [{k: v for k, v in tool.items() if v is not None}]

    return mutate


def _policy(policy: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        body["execution_policy"] = policy

    return mutate


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        body[key] = value

    return mutate


def _model(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        model = {**body["model"], **changes}
        body["model"] = {k: v for k, v in model.items() if v is not None}

    return mutate


INVALID: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "http tool without url": (_tool(url=None), "body.tools.0"),
    "builtin tool without builtin": (_tool(kind="builtin", url=None), "body.tools.0"),
    "tool without kind": (_tool(kind=None), "body.tools.0.kind"),
    "tool without description": (_tool(description=None), "body.tools.0.description"),
    "tool of unknown kind": (_tool(kind="shell"), "body.tools.0.kind"),
    "http url ftp": (_tool(url="ftp://tools.example.com/x"), "body.tools.0.url"),
    "http url file": (_tool(url="file:///etc/passwd"), "body.tools.0.url"),
    "http url without host": (_tool(url="http://"), "body.tools.0.url"),
    "parameters not a schema": (
        _tool(parameters={"type": "no-such-type"}),
        "body.tools.0.parameters",
    ),
    "duplicate tool names": (lambda b: b.update(tools=[CALCULATOR, CALCULATOR]), "body"),
    "max_retries 101": (
        _policy({"retry": {"max_retries": 101}}),
        "body.execution_policy.retry.max_retries",
    ),
    "negative max_retries": (
        _policy({"retry": {"max_retries": -1}}),
        "body.execution_policy.retry.max_retries",
    ),
    "multiplier 0.5": (
        _policy({"retry": {"multiplier": 0.5}}),
        "body.execution_policy.retry.multiplier",
    ),
    "jitter 2": (_policy({"retry": {"jitter": 2}}), "body.execution_policy.retry.jitter"),
    "negative jitter": (_policy({"retry": {"jitter": -0.1}}), "body.execution_policy.retry.jitter"),
    "unknown retry_on class": (
        _policy({"retry": {"retry_on": ["rate_limited", "gremlins"]}}),
        "body.execution_policy.retry.retry_on.1",
    ),
    "negative max_iterations": (
        _policy({"max_iterations": -1}),
        "body.execution_policy.max_iterations",
    ),
    "negative budget": (
        _policy({"budget": {"max_total_tokens": -5}}),
        "body.execution_policy.budget.max_total_tokens",
    ),
    "unknown tool error placeholder": (
        _policy({"tool_error_message_template": "{code}: {stack}"}),
        "body.execution_policy.tool_error_message_template",
    ),
    "unknown interrupted tool placeholder": (
        _policy({"interrupted_tool_message_template": "{tool_name} {code}"}),
        "body.execution_policy.interrupted_tool_message_template",
    ),
    "unknown interrupted turn placeholder": (
        _policy({"interrupted_turn_message_template": "ended: {tool_name}"}),
        "body.execution_policy.interrupted_turn_message_template",
    ),
    "unknown strategy": (
        _policy({"tool_error_strategy": "IGNORE"}),
        "body.execution_policy.tool_error_strategy",
    ),
    "unknown policy field": (_policy({"max_iteration": 3}), "body.execution_policy.max_iteration"),
    "unknown retry field": (
        _policy({"retry": {"max_retry": 3}}),
        "body.execution_policy.retry.max_retry",
    ),
    "unknown field": (_set("bogus", 1), "body.bogus"),
    "missing model": (lambda b: b.pop("model"), "body.model"),
    "missing name": (lambda b: b.pop("name"), "body.name"),
    "name with a slash": (_set("name", "a/b"), "body.name"),
    "unknown provider": (_model(provider="anthropic"), "body.model.provider"),
    "scripted without script": (_model(script=None), "body.model"),
    "script for openai": (_model(provider="openai"), "body.model"),
    "base_url not http": (
        _model(provider="openai", script=None, base_url="gopher://x"),
        "body.model.base_url",
    ),
    "reply with two kinds": (
        _model(script=[{"content": "a", "hang_ms": 5}]),
        "body.model.script.0",
    ),
    "tools not a list": (_set("tools", {"name": "x"}), "body.tools"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_agent_is_422_naming_the_field(api_only: Any, case: str) -> None:
    mutate, field = INVALID[case]
    body = _body("invalid")
    mutate(body)
    r = api_only.post("/v1/agents", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["code"] == "validation_error"
    assert problem["status"] == 422
    fields = [e["field"] for e in problem["errors"]]
    assert field in fields, fields
    assert all(e["message"] for e in problem["errors"])
    # nothing was stored
    assert api_only.get("/v1/agents/invalid").status_code == 404
    assert api_only.get("/v1/agents").json()["items"] == []


def test_version_numbers_are_per_name(api_only: Any) -> None:
    for _ in range(3):
        create_agent(api_only, "a1", scripted({"content": "x"}))
    b = create_agent(api_only, "b1", scripted({"content": "y"}))
    assert b["version"] == 1
    assert api_only.get("/v1/agents/a1").json()["version"] == 3
    versions = [
        api_only.get("/v1/agents/a1", params={"version": v}).json()["version"] for v in (1, 2, 3)
    ]
    assert versions == [1, 2, 3]


def test_agent_answer_never_carries_an_api_key(api_only: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("TR_TEST_SECRET_KEY", "sk-secret-value-123")
    body = {
        "name": "openai-agent",
        "tools": [],
        "model": {
            "provider": "openai",
            "model": "gpt-x",
            "api_key_env": "TR_TEST_SECRET_KEY",
            "base_url": "https://llm.example.com/v1",
        },
    }
    r = api_only.post("/v1/agents", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["model"]["api_key_env"] == "TR_TEST_SECRET_KEY"
    for answer in (r, api_only.get("/v1/agents/openai-agent"), api_only.get("/v1/agents")):
        assert "sk-secret-value-123" not in answer.text
