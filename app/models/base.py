"""What the runner asks of a model provider, and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from app.domain.agent import ModelSpec, ToolSpec
from app.domain.transcript import Message, ToolCall


@dataclass(frozen=True)
class ModelRequest:
    spec: ModelSpec
    messages: list[Message]
    tools: list[ToolSpec]
    # How many model calls this turn made before this one (attempts, failed ones included).
    call_index: int
    # Already cut to the turn's remaining wall-time budget.
    timeout_s: float
    turn_id: str


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0


class ModelProvider(Protocol):
    """A model; raises FailureError (app.domain.failures) with a classified failure."""

    async def complete(self, request: ModelRequest) -> ModelReply: ...
