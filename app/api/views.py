"""Rows as the API shows them (API.md shapes)."""

from __future__ import annotations

from typing import Any


def turn(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "agent": {"name": row["agent_name"], "version": row["agent_version"]},
        "conversation_id": row["conversation_id"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "retry_count": row["retry_count"],
        "consecutive_retry_count": row["consecutive_retry_count"],
        "next_runnable_at": row["next_runnable_at"],
        "counters": {
            "iterations": row["iterations"],
            "steps": row["steps"],
            "tool_calls": row["tool_calls"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "total_tokens": row["input_tokens"] + row["output_tokens"],
        },
        "execution_policy": row["execution_policy"],
        "last_error": row["last_error"],
        "pending_tool_calls": [
            {"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or {}}
            for c in row["pending_tool_calls"] or []
        ],
        "output": row["output"],
        "cancel_requested": row["cancel_requested"],
        "metadata": row["metadata"] or {},
        "version": row["version"],
    }


def message(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": row["seq"],
        "role": row["role"],
        "content": row["content"],
        "created_at": row["created_at"],
    }
    if row["tool_calls"]:
        out["tool_calls"] = [
            {"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or {}}
            for c in row["tool_calls"]
        ]
    if row["tool_call_id"]:
        out["tool_call_id"] = row["tool_call_id"]
    if row["name"]:
        out["name"] = row["name"]
    return out


def event(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": row["seq"],
        "type": row["type"],
        "data": row["data"],
        "created_at": row["created_at"],
    }


def agent(row: dict[str, Any]) -> dict[str, Any]:
    return {**row["spec"], "version": row["version"], "created_at": row["created_at"]}
