"""The execution policy: defaults, validation on the way in, templates, and resolution as a whole
(RUNNER.md, "Execution policy")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from app.domain.failures import ErrorClass
from app.domain.policy import (
    Budget,
    ExecutionPolicy,
    RetryPolicy,
    ToolErrorStrategy,
    placeholders,
    render,
    resolve_policy,
)

DEFAULT_JSON: dict[str, Any] = {
    "max_iterations": 100,
    "max_steps": 1000,
    "budget": {
        "max_duration_ms": None,
        "max_input_tokens": None,
        "max_output_tokens": None,
        "max_total_tokens": None,
        "max_tool_calls": None,
    },
    "retry": {
        "max_retries": 0,
        "initial_delay_ms": 1000,
        "multiplier": 2.0,
        "max_delay_ms": 60000,
        "jitter": 0.0,
        "respect_retry_after": True,
        "retry_on": None,
    },
    "tool_error_strategy": "FAIL_RUN",
    "tool_error_message_template": '{"code":"{code}","message":"{message}"}',
    "tool_timeout_ms": 30000,
    "interrupted_tool_message_template": "Tool {tool_name} did not complete: {reason}",
    "interrupted_turn_message_template": "This turn ended before completion: {reason}",
    "cancellation_reason": "cancelled by caller",
}


def locs(info: pytest.ExceptionInfo[ValidationError]) -> list[tuple[int | str, ...]]:
    return [tuple(e["loc"]) for e in info.value.errors()]


# ---- defaults ---------------------------------------------------------------------------------


def test_defaults_match_runner_md() -> None:
    assert ExecutionPolicy().model_dump(mode="json") == DEFAULT_JSON


def test_empty_body_gives_the_defaults() -> None:
    assert ExecutionPolicy.model_validate({}) == ExecutionPolicy()
    assert ExecutionPolicy.model_validate({"retry": {}, "budget": {}}) == ExecutionPolicy()


def test_default_policy_round_trips_through_json() -> None:
    policy = ExecutionPolicy()
    again = ExecutionPolicy.model_validate(json.loads(policy.model_dump_json()))
    assert again == policy


def test_full_policy_round_trips() -> None:
    body = {
        "max_iterations": 5,
        "max_steps": 50,
        "budget": {"max_duration_ms": 10, "max_total_tokens": 20000, "max_tool_calls": 3},
        "retry": {
            "max_retries": 3,
            "initial_delay_ms": 100,
            "multiplier": 1.5,
            "max_delay_ms": 400,
            "jitter": 0.5,
            "respect_retry_after": False,
            "retry_on": ["rate_limited", "auth"],
        },
        "tool_error_strategy": "RETURN_ERROR_TO_MODEL",
        "tool_timeout_ms": 5,
    }
    policy = ExecutionPolicy.model_validate(body)
    assert policy.tool_error_strategy is ToolErrorStrategy.RETURN_ERROR_TO_MODEL
    assert policy.retry.retry_on == [ErrorClass.RATE_LIMITED, ErrorClass.AUTH]
    assert policy.budget.max_total_tokens == 20000
    assert ExecutionPolicy.model_validate(policy.model_dump(mode="json")) == policy


def test_policy_is_frozen() -> None:
    policy = ExecutionPolicy()
    with pytest.raises(ValidationError):
        policy.max_steps = 5  # type: ignore[misc]


# ---- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"max_iterations": -1}, ("max_iterations",)),
        ({"max_steps": -1}, ("max_steps",)),
        ({"tool_timeout_ms": -1}, ("tool_timeout_ms",)),
        ({"budget": {"max_duration_ms": -1}}, ("budget", "max_duration_ms")),
        ({"budget": {"max_input_tokens": -1}}, ("budget", "max_input_tokens")),
        ({"budget": {"max_output_tokens": -1}}, ("budget", "max_output_tokens")),
        ({"budget": {"max_total_tokens": -1}}, ("budget", "max_total_tokens")),
        ({"budget": {"max_tool_calls": -1}}, ("budget", "max_tool_calls")),
        ({"retry": {"max_retries": -1}}, ("retry", "max_retries")),
        ({"retry": {"initial_delay_ms": -1}}, ("retry", "initial_delay_ms")),
        ({"retry": {"max_delay_ms": -1}}, ("retry", "max_delay_ms")),
        ({"retry": {"multiplier": 0.99}}, ("retry", "multiplier")),
        ({"retry": {"multiplier": 0}}, ("retry", "multiplier")),
        ({"retry": {"multiplier": float("nan")}}, ("retry", "multiplier")),
        ({"retry": {"jitter": -0.01}}, ("retry", "jitter")),
        ({"retry": {"jitter": 1.01}}, ("retry", "jitter")),
        ({"retry": {"jitter": float("nan")}}, ("retry", "jitter")),
        ({"retry": {"max_retries": 101}}, ("retry", "max_retries")),
        ({"retry": {"retry_on": ["rate_limited", "teapot"]}}, ("retry", "retry_on", 1)),
        ({"tool_error_strategy": "IGNORE"}, ("tool_error_strategy",)),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_invalid_values_name_the_field(body: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ExecutionPolicy.model_validate(body)
    assert locs(info) == [loc]


@pytest.mark.parametrize(
    "body",
    [
        {"retry": {"multiplier": 1.0, "jitter": 0.0, "max_retries": 100}},
        {"retry": {"jitter": 1.0}},
        {"retry": {"initial_delay_ms": 0, "max_delay_ms": 0}},
        {"budget": {"max_tool_calls": 0, "max_total_tokens": 0}},
        {"retry": {"retry_on": []}},
        {"retry": {"retry_on": [c.value for c in ErrorClass]}},
    ],
)
def test_boundary_values_are_accepted(body: dict[str, Any]) -> None:
    ExecutionPolicy.model_validate(body)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"max_iteration": 3}, ("max_iteration",)),
        ({"budget": {"max_tokens": 3}}, ("budget", "max_tokens")),
        ({"retry": {"retries": 3}}, ("retry", "retries")),
    ],
)
def test_unknown_fields_are_refused_at_every_level(
    body: dict[str, Any], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as info:
        ExecutionPolicy.model_validate(body)
    assert locs(info) == [loc]
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_unknown_fields_refused_on_the_sub_models_directly() -> None:
    with pytest.raises(ValidationError) as info:
        Budget.model_validate({"max_steps": 1})
    assert locs(info) == [("max_steps",)]
    with pytest.raises(ValidationError) as info:
        RetryPolicy.model_validate({"backoff": 1})
    assert locs(info) == [("backoff",)]


@pytest.mark.parametrize(
    ("field", "template", "unknown"),
    [
        ("tool_error_message_template", "{code}: {reason}", "reason"),
        ("tool_error_message_template", '{"e":"{error}"}', "error"),
        ("interrupted_tool_message_template", "{tool_name}: {message}", "message"),
        ("interrupted_tool_message_template", "{code}", "code"),
        ("interrupted_turn_message_template", "{tool_name} ended: {reason}", "tool_name"),
        ("interrupted_turn_message_template", "ended after {steps}", "steps"),
    ],
)
def test_unknown_placeholder_is_refused_naming_the_field(
    field: str, template: str, unknown: str
) -> None:
    with pytest.raises(ValidationError) as info:
        ExecutionPolicy.model_validate({field: template})
    assert locs(info) == [(field,)]
    assert unknown in info.value.errors()[0]["msg"]


@pytest.mark.parametrize(
    ("field", "template"),
    [
        ("tool_error_message_template", '{"code":"{code}","message":"{message}"}'),
        (
            "tool_error_message_template",
            '{"tool":"{tool_name}","id":"{tool_call_id}","error":{"code":"{code}"}}',
        ),
        ("tool_error_message_template", "Error {code} in {tool_name}: {message}"),
        ("tool_error_message_template", "no placeholders at all"),
        ("interrupted_tool_message_template", "{tool_name} ({tool_call_id}): {reason}"),
        ("interrupted_tool_message_template", '{"interrupted": true, "why": "{reason}"}'),
        ("interrupted_turn_message_template", "Stopped: {reason}"),
        ("interrupted_turn_message_template", '{"stopped": {"reason": "{reason}"}}'),
    ],
)
def test_valid_templates_are_accepted(field: str, template: str) -> None:
    policy = ExecutionPolicy.model_validate({field: template})
    assert getattr(policy, field) == template


def test_too_long_template_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        ExecutionPolicy.model_validate({"interrupted_turn_message_template": "x" * 4001})
    assert locs(info) == [("interrupted_turn_message_template",)]


# ---- placeholders and render ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "found"),
    [
        ("", set()),
        ("plain text", set()),
        ("{reason}", {"reason"}),
        ("{a} and {b} and {a}", {"a", "b"}),
        ('{"code":"{code}","message":"{message}"}', {"code", "message"}),
        ('{"a": {"b": 1}}', set()),
        ("{ spaced }", set()),
        ("{1abc}", set()),
        ("unclosed {reason", set()),
        ("{}", set()),
    ],
)
def test_placeholders(template: str, found: set[str]) -> None:
    assert placeholders(template) == found


def test_render_fills_known_placeholders() -> None:
    assert render("Tool {tool_name} did not complete: {reason}", tool_name="t", reason="r") == (
        "Tool t did not complete: r"
    )
    assert render("{a}{a}", a="x") == "xx"


def test_render_leaves_json_braces_and_unknown_names_alone() -> None:
    template = '{"code":"{code}","message":"{message}","extra":{"n":1},"keep":"{other}"}'
    out = render(template, code="tool_failed", message="boom")
    assert out == '{"code":"tool_failed","message":"boom","extra":{"n":1},"keep":"{other}"}'
    assert json.loads(out) == {
        "code": "tool_failed",
        "message": "boom",
        "extra": {"n": 1},
        "keep": "{other}",
    }


def test_render_default_tool_error_template_is_json() -> None:
    out = render(ExecutionPolicy().tool_error_message_template, code="c", message="m")
    assert json.loads(out) == {"code": "c", "message": "m"}


def test_render_does_not_substitute_inside_values() -> None:
    # A value is data, not template: a caller-supplied text that happens to look like a
    # placeholder must come out as written. (Fails today: render replaces names one after the
    # other, so a value holding "{b}" is filled by the later replacement of b.)
    assert render("{a} / {b}", a="{b}", b="x") == "{b} / x"


# ---- resolution -------------------------------------------------------------------------------

SERVER = ExecutionPolicy(max_iterations=7)
AGENT = ExecutionPolicy.model_validate(
    {
        "max_iterations": 20,
        "retry": {"max_retries": 5, "initial_delay_ms": 10},
        "budget": {"max_tool_calls": 9},
        "tool_error_strategy": "RETURN_ERROR_TO_MODEL",
    }
)


def test_turn_policy_wins_whole_over_agent() -> None:
    turn = ExecutionPolicy.model_validate({"max_iterations": 3})
    resolved = resolve_policy(SERVER, AGENT, turn)
    assert resolved == turn
    assert resolved.max_iterations == 3
    # Not the agent's retry, budget or strategy: the defaults, because no field merge happens.
    assert resolved.retry == RetryPolicy()
    assert resolved.retry.max_retries == 0
    assert resolved.budget == Budget()
    assert resolved.tool_error_strategy is ToolErrorStrategy.FAIL_RUN


def test_agent_policy_wins_whole_over_server_default() -> None:
    resolved = resolve_policy(SERVER, AGENT, None)
    assert resolved == AGENT
    assert resolved.max_iterations == 20
    assert resolved.retry.max_retries == 5


def test_agent_policy_does_not_inherit_server_fields() -> None:
    server = ExecutionPolicy.model_validate({"max_steps": 11, "retry": {"max_retries": 4}})
    agent = ExecutionPolicy.model_validate({"max_iterations": 2})
    resolved = resolve_policy(server, agent, None)
    assert resolved.max_steps == 1000
    assert resolved.retry.max_retries == 0


def test_server_default_when_nothing_else() -> None:
    assert resolve_policy(SERVER, None, None) == SERVER
    assert resolve_policy(SERVER, None, None).max_iterations == 7


def test_turn_policy_over_server_when_agent_has_none() -> None:
    turn = ExecutionPolicy(max_steps=2)
    resolved = resolve_policy(SERVER, None, turn)
    assert resolved == turn
    assert resolved.max_iterations == 100


# ---- retry classes ----------------------------------------------------------------------------


def test_retryable_classes() -> None:
    assert RetryPolicy().retryable_classes() is None
    assert RetryPolicy(retry_on=[]).retryable_classes() == frozenset()
    assert RetryPolicy.model_validate(
        {"retry_on": ["auth", "auth", "timeout"]}
    ).retryable_classes() == frozenset({ErrorClass.AUTH, ErrorClass.TIMEOUT})
