"""What the runner asks of a tool executor, and the context a tool sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.domain.agent import ToolSpec


@dataclass(frozen=True)
class ToolContext:
    turn_id: str
    tool_call_id: str
    # "{turn_id}:{tool_call_id}": stable across re-runs after a crash, so a tool can recognise them.
    idempotency_key: str
    # Already cut to the turn's remaining wall-time budget.
    timeout_s: float


class ToolExecutor(Protocol):
    """Runs one tool call; returns the tool message content or raises FailureError."""

    async def execute(self, spec: ToolSpec, arguments: dict[str, Any], ctx: ToolContext) -> str: ...
