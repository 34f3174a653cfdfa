"""Agent definitions: model, tools and default policy, validated on the way in (API.md, Agents)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.domain.policy import ExecutionPolicy

Name = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Usage(_Strict):
    input_tokens: int = Field(0, ge=0)
    output_tokens: int = Field(0, ge=0)


class ScriptedToolCall(_Strict):
    name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedError(_Strict):
    status: int = Field(ge=400, le=599)
    code: str | None = Field(None, max_length=200)
    message: str | None = Field(None, max_length=2000)
    retry_after_ms: int | None = Field(None, ge=0)


class Reply(_Strict):
    """One scripted model answer: exactly one of content, tool_calls, error, hang_ms."""

    content: str | None = None
    tool_calls: list[ScriptedToolCall] | None = None
    error: ScriptedError | None = None
    hang_ms: int | None = Field(None, ge=0, le=3_600_000)
    usage: Usage | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Reply:
        given = [
            k for k in ("content", "tool_calls", "error", "hang_ms") if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError("a reply has exactly one of content, tool_calls, error, hang_ms")
        if self.tool_calls is not None and not self.tool_calls:
            raise ValueError("tool_calls must not be empty")
        return self


class Provider(StrEnum):
    OPENAI = "openai"
    SCRIPTED = "scripted"


def _http_url(value: str | None) -> str | None:
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an http(s) URL")
    return value


# Environment variables a model's `api_key_env` may never name (the service's own settings).
RESERVED_ENV_PREFIX = "TURNRUNNER_"


class ModelSpec(_Strict):
    provider: Provider
    model: str = Field(min_length=1, max_length=200)
    base_url: str | None = Field(None, max_length=2000)
    api_key_env: str | None = Field(
        None,
        max_length=200,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable the API key is read from (never a TURNRUNNER_* "
        "variable); the key itself is never stored or returned.",
    )
    timeout_ms: int | None = Field(None, ge=1, le=3_600_000)
    params: dict[str, Any] = Field(default_factory=dict)
    script: list[Reply] | None = Field(None, min_length=1, max_length=10_000)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return _http_url(v)

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env(cls, v: str | None) -> str | None:
        # The service's own settings (tokens, database URL) live in TURNRUNNER_* variables: a
        # model spec naming one would have the worker send that secret to the model's server.
        if v is not None and v.upper().startswith(RESERVED_ENV_PREFIX):
            raise ValueError(
                f"must not name one of the service's own {RESERVED_ENV_PREFIX}* variables"
            )
        return v

    @model_validator(mode="after")
    def _provider_fields(self) -> ModelSpec:
        if self.provider is Provider.SCRIPTED and not self.script:
            raise ValueError("a scripted model needs a non-empty script")
        if self.provider is Provider.OPENAI and self.script is not None:
            raise ValueError("script is only for the scripted provider")
        return self


class ToolKind(StrEnum):
    HTTP = "http"
    EXTERNAL = "external"
    BUILTIN = "builtin"


class ToolSpec(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = Field(max_length=4000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    kind: ToolKind
    url: str | None = Field(None, max_length=2000)
    builtin: str | None = Field(None, max_length=200)
    timeout_ms: int | None = Field(None, ge=1, le=86_400_000)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return _http_url(v)

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as e:
            raise ValueError(f"not a valid JSON Schema: {e.message}") from None
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> ToolSpec:
        if self.kind is ToolKind.HTTP and not self.url:
            raise ValueError("an http tool needs url")
        if self.kind is ToolKind.BUILTIN and not self.builtin:
            raise ValueError("a builtin tool needs builtin (the registered tool name)")
        return self


class AgentSpec(_Strict):
    """The body of `POST /v1/agents`; each create adds a version."""

    name: str = Name
    description: str | None = Field(None, max_length=4000)
    model: ModelSpec
    system_prompt: str | None = Field(None, max_length=100_000)
    tools: list[ToolSpec] = Field(default_factory=list, max_length=128)
    execution_policy: ExecutionPolicy | None = None

    @model_validator(mode="after")
    def _unique_tools(self) -> AgentSpec:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique")
        return self

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


Role = Literal["system", "user", "assistant", "tool"]
