"""The transcript: open tool calls, unique ids, closing an unfinished turn, tool error text
(RUNNER.md, "Ending a turn other than COMPLETED" and "Errors")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.domain.policy import ExecutionPolicy
from app.domain.transcript import (
    Message,
    ToolCall,
    closing_messages,
    tool_error_message,
    unique_tool_call_ids,
    unresolved_tool_calls,
)


def call(id_: str, name: str = "calc", **arguments: Any) -> ToolCall:
    return ToolCall(id_, name, arguments)


def asks(*calls: ToolCall) -> Message:
    return Message(role="assistant", content=None, tool_calls=tuple(calls))


def result(call_id: str, content: str = "ok") -> Message:
    return Message(role="tool", content=content, tool_call_id=call_id)


SYSTEM = Message(role="system", content="be brief")
USER = Message(role="user", content="hi")


# ---- ToolCall JSON ----------------------------------------------------------------------------


def test_tool_call_json_round_trip() -> None:
    c = ToolCall("c1", "calc", {"expr": "1+1"})
    assert c.to_json() == {"id": "c1", "name": "calc", "arguments": {"expr": "1+1"}}
    assert ToolCall.from_json(c.to_json()) == c
    raw = ToolCall("c2", "calc", {}, raw_arguments="{not json")
    assert raw.to_json()["raw_arguments"] == "{not json"
    assert ToolCall.from_json(raw.to_json()) == raw
    assert ToolCall.from_json({"id": "c3", "name": "t", "arguments": None}).arguments == {}


# ---- unresolved_tool_calls --------------------------------------------------------------------


def test_no_messages_no_open_calls() -> None:
    assert unresolved_tool_calls([]) == []
    assert unresolved_tool_calls([SYSTEM, USER]) == []


def test_all_calls_open() -> None:
    a, b = call("a"), call("b")
    assert unresolved_tool_calls([SYSTEM, USER, asks(a, b)]) == [a, b]


def test_some_calls_answered() -> None:
    a, b, c = call("a"), call("b"), call("c")
    msgs = [USER, asks(a, b, c), result("b")]
    assert unresolved_tool_calls(msgs) == [a, c]


def test_all_answered() -> None:
    a, b = call("a"), call("b")
    assert unresolved_tool_calls([USER, asks(a, b), result("a"), result("b")]) == []


def test_only_the_last_asking_message_counts() -> None:
    old, new = call("old"), call("new")
    msgs = [USER, asks(old), result("old"), asks(new)]
    assert unresolved_tool_calls(msgs) == [new]


def test_assistant_answer_after_tool_calls_closes_nothing_open() -> None:
    a = call("a")
    msgs = [USER, asks(a), result("a"), Message(role="assistant", content="done")]
    assert unresolved_tool_calls(msgs) == []


def test_user_message_after_open_calls_keeps_them_open() -> None:
    a = call("a")
    assert unresolved_tool_calls([USER, asks(a), Message(role="user", content="hurry")]) == [a]


def test_results_before_the_asking_message_do_not_count() -> None:
    a = call("a")
    assert unresolved_tool_calls([result("a"), asks(a)]) == [a]


# ---- unique_tool_call_ids ---------------------------------------------------------------------


def test_unique_ids_untouched_when_already_unique() -> None:
    calls = [call("a"), call("b", "search", q="x")]
    taken: set[str] = set()
    assert unique_tool_call_ids(calls, taken) == calls
    assert taken == {"a", "b"}


def test_duplicate_ids_made_unique_keeping_the_rest() -> None:
    calls = [call("a", "t1", x=1), call("a", "t2", x=2), call("a", "t3", x=3)]
    taken: set[str] = set()
    out = unique_tool_call_ids(calls, taken)
    ids = [c.id for c in out]
    assert ids[0] == "a"
    assert len(set(ids)) == 3
    assert [(c.name, c.arguments) for c in out] == [
        ("t1", {"x": 1}),
        ("t2", {"x": 2}),
        ("t3", {"x": 3}),
    ]
    assert taken == set(ids)


def test_ids_taken_earlier_in_the_turn_are_avoided() -> None:
    taken = {"call_1", "call_1_2"}
    out = unique_tool_call_ids([call("call_1"), call("x")], taken)
    assert out[0].id not in {"call_1", "call_1_2"}
    assert out[1].id == "x"
    assert len({c.id for c in out}) == 2
    assert taken >= {"call_1", "call_1_2", out[0].id, "x"}


def test_empty_ids_get_unique_non_empty_ids() -> None:
    taken = {"call_0", "call_1", "call_2"}
    out = unique_tool_call_ids([call(""), call(""), call("")], taken)
    ids = [c.id for c in out]
    assert all(ids)
    assert len(set(ids)) == 3
    assert not {"call_0", "call_1", "call_2"} & set(ids)


def test_unique_ids_across_two_model_answers() -> None:
    taken: set[str] = set()
    first = unique_tool_call_ids([call("c"), call("")], taken)
    second = unique_tool_call_ids([call("c"), call(""), call(first[1].id)], taken)
    ids = [c.id for c in first + second]
    assert len(set(ids)) == 5
    assert all(ids)


def test_raw_arguments_are_kept() -> None:
    out = unique_tool_call_ids(
        [ToolCall("a", "t", {}, "{bad"), ToolCall("a", "t", {}, "{bad2")], set()
    )
    assert [c.raw_arguments for c in out] == ["{bad", "{bad2"]


# ---- closing_messages -------------------------------------------------------------------------


def test_closing_with_open_calls() -> None:
    a, b = call("a", "calc"), call("b", "search")
    msgs = [SYSTEM, USER, asks(a, b)]
    out = closing_messages(msgs, ExecutionPolicy(), "cancelled by caller")
    assert [(m.role, m.tool_call_id, m.name, m.content) for m in out] == [
        ("tool", "a", "calc", "Tool calc did not complete: cancelled by caller"),
        ("tool", "b", "search", "Tool search did not complete: cancelled by caller"),
        ("assistant", None, None, "This turn ended before completion: cancelled by caller"),
    ]
    assert all(m.meta == {"interrupted": True} for m in out)
    assert out[-1].tool_calls == ()
    # Nothing dangling afterwards.
    assert unresolved_tool_calls(msgs + out) == []


def test_closing_only_the_unanswered_calls() -> None:
    a, b = call("a"), call("b")
    msgs = [USER, asks(a, b), result("a")]
    out = closing_messages(msgs, ExecutionPolicy(), "max_steps (used=3, limit=3)")
    assert [(m.role, m.tool_call_id) for m in out] == [("tool", "b"), ("assistant", None)]
    assert unresolved_tool_calls(msgs + out) == []


def test_closing_without_open_calls_is_one_assistant_message() -> None:
    out = closing_messages([SYSTEM, USER], ExecutionPolicy(), "budget")
    assert len(out) == 1
    assert out[0].role == "assistant"
    assert out[0].content == "This turn ended before completion: budget"


def test_closing_uses_the_policy_templates() -> None:
    policy = ExecutionPolicy.model_validate(
        {
            "interrupted_tool_message_template": '{"id":"{tool_call_id}","tool":"{tool_name}",'
            '"why":"{reason}"}',
            "interrupted_turn_message_template": "[stopped] {reason}",
        }
    )
    out = closing_messages([USER, asks(call("c9", "sleep"))], policy, "timeout")
    assert json.loads(out[0].content or "") == {"id": "c9", "tool": "sleep", "why": "timeout"}
    assert out[1].content == "[stopped] timeout"


# ---- tool_error_message -----------------------------------------------------------------------


def test_tool_error_message_default_template() -> None:
    text = tool_error_message(ExecutionPolicy(), call("c1"), "invalid_arguments", "x is required")
    assert json.loads(text) == {"code": "invalid_arguments", "message": "x is required"}


@pytest.mark.parametrize(
    "message",
    [
        'argument "x" is not a number',
        "path C:\\temp\\file",
        "ends with a backslash \\",
        'both \\" mixed',
        "",
    ],
)
def test_tool_error_message_escapes_message_so_json_stays_json(message: str) -> None:
    text = tool_error_message(ExecutionPolicy(), call("c1"), "tool_failed", message)
    assert json.loads(text) == {"code": "tool_failed", "message": message}


def test_tool_error_message_escapes_the_code_too() -> None:
    # `{code}` may be what an external tool reported (API.md tool-results: any string), so it
    # must not break the JSON either. (Fails today: only the message is escaped.)
    code = 'E"42\\x'
    text = tool_error_message(ExecutionPolicy(), call("c1"), code, "boom")
    assert json.loads(text) == {"code": code, "message": "boom"}


def test_tool_error_message_does_not_fill_placeholders_inside_the_message() -> None:
    # The message is data. (Fails today: render substitutes one name after the other, so a
    # message containing "{tool_call_id}" has the call id put into it.)
    message = "missing field {tool_call_id}"
    text = tool_error_message(ExecutionPolicy(), call("c1"), "invalid_arguments", message)
    assert json.loads(text) == {"code": "invalid_arguments", "message": message}


def test_tool_error_message_custom_template_all_placeholders() -> None:
    policy = ExecutionPolicy(
        tool_error_message_template="{tool_name}#{tool_call_id} failed ({code}): {message}"
    )
    text = tool_error_message(policy, call("c7", "search"), "tool_timeout", "took 30s")
    assert text == "search#c7 failed (tool_timeout): took 30s"
