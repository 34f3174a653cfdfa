"""The demo path on both databases, in-process."""

from __future__ import annotations

from typing import Any

from tests.helpers import CALCULATOR, create_agent, create_turn, messages, scripted, wait_status


def test_tool_then_answer_completes(client: Any) -> None:
    create_agent(
        client,
        "calc",
        scripted(
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
            {"content": "five"},
        ),
        tools=[CALCULATOR],
        system_prompt="be brief",
    )
    turn = create_turn(client, "calc", "2+3?")
    done = wait_status(client, turn["id"], "COMPLETED")
    assert done["output"] == "five"
    roles = [m["role"] for m in messages(client, turn["id"])]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert messages(client, turn["id"])[3]["content"] == "5"
