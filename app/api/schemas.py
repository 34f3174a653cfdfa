"""Request and response bodies of the HTTP API (API.md); the OpenAPI document comes from these."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.domain.agent import AgentSpec, ModelSpec
from app.domain.policy import ExecutionPolicy
from app.domain.status import TurnStatus

# Versions and sequence numbers are 32-bit integer columns; a larger number in a request is a
# validation error, not a database overflow.
MAX_INT32 = 2**31 - 1


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Agent(AgentSpec):
    version: int
    created_at: datetime


class AgentList(BaseModel):
    items: list[Agent]


class CreateTurn(_In):
    agent: str = Field(min_length=1, max_length=200)
    agent_version: int | None = Field(None, ge=1, le=MAX_INT32)
    input: str = Field(max_length=1_000_000)
    conversation_id: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$"
    )
    execution_policy: ExecutionPolicy | None = None
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)


class AgentRef(BaseModel):
    name: str
    version: int


class TurnCounters(BaseModel):
    iterations: int
    steps: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    total_tokens: int


class Failure(BaseModel):
    failure_id: str
    source: str
    error_class: str
    http_status: int | None
    code: str | None
    message: str
    retryable: bool
    retry_after_ms: int | None
    at: datetime


class ToolCallOut(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]


class Turn(BaseModel):
    id: str
    agent: AgentRef
    conversation_id: str
    status: TurnStatus
    status_reason: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    retry_count: int
    consecutive_retry_count: int
    next_runnable_at: datetime | None
    counters: TurnCounters
    execution_policy: ExecutionPolicy
    last_error: Failure | None
    pending_tool_calls: list[ToolCallOut]
    output: str | None
    cancel_requested: bool
    metadata: dict[str, str]
    version: int


class TurnList(BaseModel):
    items: list[Turn]
    next_cursor: str | None


class Message(BaseModel):
    seq: int
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    created_at: datetime


class MessageList(BaseModel):
    items: list[Message]


class Event(BaseModel):
    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


class EventList(BaseModel):
    items: list[Event]
    next_after: int | None = Field(
        description="When the page is full (more events may follow), the `seq` of its last "
        "event: ask again with `after` set to it. Null when the page holds every event there is."
    )


class Command(StrEnum):
    RETRY = "RETRY"
    CONTINUE = "CONTINUE"
    RETRY_MODEL = "RETRY_MODEL"
    USER_MESSAGE = "USER_MESSAGE"
    TOOL_RESULT = "TOOL_RESULT"
    TOOL_ERROR = "TOOL_ERROR"


class RetryBody(_In):
    force: bool = False


class RetryModelBody(_In):
    failure_id: str = Field(min_length=1, max_length=200)
    model: ModelSpec | None = None


class UserMessageBody(_In):
    content: str = Field(max_length=1_000_000)
    message_id: str | None = Field(None, min_length=1, max_length=200)


class ToolError(_In):
    code: str = Field(min_length=1, max_length=200)
    message: str = Field("", max_length=10_000)


class ToolResultBody(_In):
    tool_call_id: str = Field(min_length=1, max_length=200)
    content: Any = None
    error: ToolError | None = None

    @model_validator(mode="after")
    def _one(self) -> ToolResultBody:
        if (self.content is None) == (self.error is None):
            raise ValueError("give exactly one of content and error")
        return self


class CancelBody(_In):
    reason: str | None = Field(None, max_length=1000)


class ResumeBody(_In):
    """The generic command: the fields of the matching shortcut go beside `command`."""

    command: Command
    failure_id: str | None = Field(None, max_length=200)
    model: ModelSpec | None = None
    content: Any = None
    message_id: str | None = Field(None, min_length=1, max_length=200)
    tool_call_id: str | None = Field(None, max_length=200)
    error: ToolError | None = None


class DueTurns(BaseModel):
    items: list[Turn]
