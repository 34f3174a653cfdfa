"""`turnrunner serve` as a real process on embedded SQLite, driving the registered `demo` agent."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.e2e.conftest import Launcher

ANSWER = "6 * 7 = 42."


def test_serve_runs_the_demo_agent_to_completion(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        launcher = Launcher(f"sqlite:///{tmp_path / 'turnrunner.db'}", tmp_path, stack)
        # The demo agent is registered by default; the fast-test env switched it off.
        api = launcher.serve(TURNRUNNER_REGISTER_DEMO_AGENT="true")
        try:
            agent = api.http.get("/v1/agents/demo")
            assert agent.status_code == 200, agent.text
            assert agent.json()["model"]["provider"] == "scripted"

            turn = api.create_turn("demo", "What is 6 times 7?")
            assert turn["status"] == "READY"
            assert turn["agent"] == {"name": "demo", "version": 1}
            done = api.wait_terminal(turn["id"])
            assert done["status"] == "COMPLETED", done
            assert done["output"] == ANSWER
            assert done["last_error"] is None
            assert done["counters"] == {
                "iterations": 2,
                "steps": 3,
                "tool_calls": 1,
                "input_tokens": 52,
                "output_tokens": 14,
                "total_tokens": 66,
            }
            assert done["retry_count"] == 0 and done["finished_at"] is not None

            messages = api.messages(turn["id"])
            assert [m["role"] for m in messages] == [
                "system",
                "user",
                "assistant",
                "tool",
                "assistant",
            ]
            assert [m["seq"] for m in messages] == [1, 2, 3, 4, 5]
            assert messages[1]["content"] == "What is 6 times 7?"
            (call,) = messages[2]["tool_calls"]
            assert call["name"] == "calculator"
            assert call["arguments"] == {"expression": "6*7"}
            assert messages[3]["tool_call_id"] == call["id"]
            assert messages[3]["content"] == "42"
            assert messages[4]["content"] == ANSWER
            assert not messages[4].get("tool_calls")

            events = api.events(turn["id"])
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
            assert events[0]["type"] == "created"
            assert events[0]["data"]["agent"] == "demo"
            moves = [
                (e["data"]["from"], e["data"]["to"])
                for e in events
                if e["type"] == "status_changed"
            ]
            assert moves == [("READY", "RUNNING"), ("RUNNING", "RUNNING"), ("RUNNING", "COMPLETED")]
            models = [e["data"] for e in events if e["type"] == "model_attempt"]
            assert [(m["attempt"], m["outcome"], m["model"]) for m in models] == [
                (1, "ok", "demo-script"),
                (2, "ok", "demo-script"),
            ]
            assert [m["tool_calls"] for m in models] == [1, 0]
            tools = [e["data"] for e in events if e["type"] == "tool_attempt"]
            assert len(tools) == 1
            assert tools[0]["tool"] == "calculator" and tools[0]["outcome"] == "ok"
            assert tools[0]["idempotency_key"] == f"{turn['id']}:{call['id']}"
            # The order of the log is the order things happened in.
            kinds = [e["type"] for e in events]
            assert kinds == [
                "created",
                "status_changed",
                "model_attempt",
                "status_changed",
                "tool_attempt",
                "model_attempt",
                "status_changed",
            ]
        except BaseException:
            launcher.dump_logs()
            raise
