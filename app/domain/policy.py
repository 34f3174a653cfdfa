"""The execution policy: validated on the way in, resolved as a whole (RUNNER.md)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.domain.failures import ErrorClass

NonNegative = Annotated[int, Field(ge=0, le=10**15)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """Resource limits of one turn; 0 or absent means unlimited."""

    max_duration_ms: NonNegative | None = None
    max_input_tokens: NonNegative | None = None
    max_output_tokens: NonNegative | None = None
    max_total_tokens: NonNegative | None = None
    max_tool_calls: NonNegative | None = None


class RetryPolicy(_Strict):
    """How transient failures are retried; max_retries does not count the first attempt."""

    max_retries: int = Field(0, ge=0, le=100)
    initial_delay_ms: int = Field(1000, ge=0, le=86_400_000)
    multiplier: float = Field(2.0, ge=1.0, le=100.0)
    max_delay_ms: int = Field(60_000, ge=0, le=86_400_000)
    jitter: float = Field(0.0, ge=0.0, le=1.0)
    respect_retry_after: bool = True
    retry_on: list[ErrorClass] | None = None

    def retryable_classes(self) -> frozenset[ErrorClass] | None:
        return None if self.retry_on is None else frozenset(self.retry_on)


class ToolErrorStrategy(StrEnum):
    FAIL_RUN = "FAIL_RUN"
    RETURN_ERROR_TO_MODEL = "RETURN_ERROR_TO_MODEL"


TOOL_ERROR_FIELDS = frozenset({"code", "message", "tool_name", "tool_call_id"})
INTERRUPTED_TOOL_FIELDS = frozenset({"tool_name", "tool_call_id", "reason"})
INTERRUPTED_TURN_FIELDS = frozenset({"reason"})


def placeholders(template: str) -> set[str]:
    """The `{name}` placeholders of a template; every other brace (JSON) is literal text."""
    found: set[str] = set()
    i = 0
    while i < len(template):
        if template[i] == "{":
            end = template.find("}", i)
            name = template[i + 1 : end] if end > 0 else ""
            if name.isidentifier():
                found.add(name)
                i = end + 1
                continue
        i += 1
    return found


_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


def render(template: str, **values: str) -> str:
    """Fill a template's known placeholders in one pass (text inside a value is never filled),
    leaving every other brace as written (JSON stays JSON)."""
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), template)


def _check_template(value: str, allowed: frozenset[str]) -> str:
    unknown = placeholders(value) - allowed
    if unknown:
        raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return value


class ExecutionPolicy(_Strict):
    """Everything that bounds and steers one turn; stored with it, never merged field by field."""

    max_iterations: int = Field(100, ge=1, le=1_000_000)
    max_steps: int = Field(1000, ge=1, le=10_000_000)
    budget: Budget = Budget()
    retry: RetryPolicy = RetryPolicy()
    tool_error_strategy: ToolErrorStrategy = ToolErrorStrategy.FAIL_RUN
    tool_error_message_template: str = Field(
        '{"code":"{code}","message":"{message}"}', max_length=4000
    )
    tool_timeout_ms: int = Field(30_000, ge=1, le=86_400_000)
    interrupted_tool_message_template: str = Field(
        "Tool {tool_name} did not complete: {reason}", max_length=4000
    )
    interrupted_turn_message_template: str = Field(
        "This turn ended before completion: {reason}", max_length=4000
    )
    cancellation_reason: str = Field("cancelled by caller", max_length=1000)

    @field_validator("tool_error_message_template")
    @classmethod
    def _tool_error_template(cls, v: str) -> str:
        return _check_template(v, TOOL_ERROR_FIELDS)

    @field_validator("interrupted_tool_message_template")
    @classmethod
    def _interrupted_tool_template(cls, v: str) -> str:
        return _check_template(v, INTERRUPTED_TOOL_FIELDS)

    @field_validator("interrupted_turn_message_template")
    @classmethod
    def _interrupted_turn_template(cls, v: str) -> str:
        return _check_template(v, INTERRUPTED_TURN_FIELDS)


def resolve_policy(
    server_default: ExecutionPolicy,
    agent_policy: ExecutionPolicy | None,
    turn_policy: ExecutionPolicy | None,
) -> ExecutionPolicy:
    """The most specific policy given wins whole: turn, else agent, else the server's default."""
    if turn_policy is not None:
        return turn_policy
    if agent_policy is not None:
        return agent_policy
    return server_default


__all__ = [
    "Budget",
    "ExecutionPolicy",
    "RetryPolicy",
    "ToolErrorStrategy",
    "placeholders",
    "render",
    "resolve_policy",
]
