"""The transcript of a turn: messages, tool calls, and how an unfinished turn is closed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.domain.policy import ExecutionPolicy, render


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the model sent arguments that are not a JSON object: the call fails as
    # invalid_arguments instead of running.
    raw_arguments: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.raw_arguments is not None:
            data["raw_arguments"] = self.raw_arguments
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolCall:
        return cls(data["id"], data["name"], data.get("arguments") or {}, data.get("raw_arguments"))


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    message_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def unresolved_tool_calls(messages: list[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message that asked for tools and have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant" and m.tool_calls:
            answered = {x.tool_call_id for x in messages[i + 1 :] if x.role == "tool"}
            return [c for c in m.tool_calls if c.id not in answered]
        if m.role == "assistant":
            return []
    return []


def unique_tool_call_ids(calls: list[ToolCall], taken: set[str]) -> list[ToolCall]:
    """Calls whose ids are unique within the turn: a model may repeat or omit ids."""
    out: list[ToolCall] = []
    for n, call in enumerate(calls):
        base = call.id or f"call_{len(taken) + n}"
        new_id, k = base, 1
        while new_id in taken:
            k += 1
            new_id = f"{base}_{k}"
        taken.add(new_id)
        out.append(ToolCall(new_id, call.name, call.arguments, call.raw_arguments))
    return out


INTERRUPTED_BY_USER = "superseded by a new user message"


def interrupted_tool_messages(
    messages: list[Message], policy: ExecutionPolicy, reason: str
) -> list[Message]:
    """One `tool` message per open call, from the interrupted-tool template."""
    return [
        Message(
            role="tool",
            content=render(
                policy.interrupted_tool_message_template,
                tool_name=call.name,
                tool_call_id=call.id,
                reason=reason,
            ),
            tool_call_id=call.id,
            name=call.name,
            meta={"interrupted": True},
        )
        for call in unresolved_tool_calls(messages)
    ]


def closing_messages(
    messages: list[Message], policy: ExecutionPolicy, reason: str
) -> list[Message]:
    """What closes a turn that ends other than COMPLETED: one tool message per open call, then
    one assistant message, so the next turn of the conversation never starts on a dangling call."""
    return [
        *interrupted_tool_messages(messages, policy, reason),
        Message(
            role="assistant",
            content=render(policy.interrupted_turn_message_template, reason=reason),
            meta={"interrupted": True},
        ),
    ]


def _json_text(value: str) -> str:
    # Escaped as inside a JSON string, so the default JSON template stays valid JSON.
    return json.dumps(value, ensure_ascii=False)[1:-1]


def tool_error_message(policy: ExecutionPolicy, call: ToolCall, code: str, message: str) -> str:
    """The `tool` message content the model sees for a tool error (already sanitized)."""
    return render(
        policy.tool_error_message_template,
        code=_json_text(code),
        message=_json_text(message),
        tool_name=_json_text(call.name),
        tool_call_id=_json_text(call.id),
    )


def tool_error_result(policy: ExecutionPolicy, call: ToolCall, code: str, message: str) -> Message:
    """The `tool` message that hands a tool error to the model, answering `call`."""
    return Message(
        role="tool",
        content=tool_error_message(policy, call, code, message),
        tool_call_id=call.id,
        name=call.name,
        meta={"error": code},
    )
