"""Waiting for turns over HTTP on both databases: the long-poll on GET /v1/turns/{id}, the
event stream (Server-Sent Events) and the operator's list of due retries (API.md)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.conftest import api_client
from tests.helpers import (
    CALCULATOR,
    TERMINAL,
    create_agent,
    create_turn,
    events,
    scripted,
    wait_status,
)

CALC_THEN_ANSWER = scripted(
    {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
    {"content": "five"},
)


class Background:
    """Run one blocking call on a thread; the test joins it with a generous timeout."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.elapsed = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                self.result = call()
            except BaseException as e:  # handed to the test thread
                self.error = e
            finally:
                self.elapsed = time.monotonic() - started

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout_s: float, on_timeout: Callable[[], Any] | None = None) -> Any:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            if on_timeout is not None:
                on_timeout()  # unblock the call, so the app can shut down
            self.thread.join(30)
            raise AssertionError(f"the call did not return within {timeout_s} s")
        if self.error is not None:
            raise self.error
        return self.result


# ---- long-poll -------------------------------------------------------------------------------


def test_long_poll_returns_as_soon_as_the_turn_changes(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    turn = create_turn(api_only, "a")
    v = turn["version"]
    url = f"/v1/turns/{turn['id']}?wait_ms=10000&after_version={v}"
    poll = Background(lambda: api_only.get(url))
    time.sleep(0.3)  # most likely waiting by now; the answer must be right either way
    command = api_only.post(f"/v1/turns/{turn['id']}/messages", json={"content": "wake up"})
    assert command.status_code == 202, command.text
    answer = poll.join(15)
    assert answer.status_code == 200, answer.text
    assert answer.json()["version"] > v
    assert answer.json()["id"] == turn["id"]
    assert poll.elapsed < 4.0, f"answered only after {poll.elapsed:.1f} s of a 10 s wait"


def test_long_poll_follows_a_worker_to_the_end(client: Any) -> None:
    create_agent(client, "calc", CALC_THEN_ANSWER, tools=[CALCULATOR])
    turn = create_turn(client, "calc")
    seen = turn["version"]
    statuses = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = client.get(f"/v1/turns/{turn['id']}", params={"wait_ms": 10000, "after_version": seen})
        assert r.status_code == 200
        now = r.json()
        assert now["version"] >= seen
        seen = now["version"]
        statuses.append(now["status"])
        if now["status"] in TERMINAL:
            break
    assert statuses[-1] == "COMPLETED"
    assert client.get(f"/v1/turns/{turn['id']}").json()["output"] == "five"


def test_long_poll_without_a_change_answers_the_same_turn_after_wait_ms(api_only: Any) -> None:
    create_agent(api_only, "a", scripted({"content": "x"}))
    turn = create_turn(api_only, "a")
    started = time.monotonic()
    r = api_only.get(
        f"/v1/turns/{turn['id']}", params={"wait_ms": 300, "after_version": turn["version"]}
    )
    elapsed = time.monotonic() - started
    assert r.status_code == 200
    assert r.json() == turn
    assert elapsed >= 0.25  # it did wait

    # a version already passed, or no wait asked: answered at once
    started = time.monotonic()
    r = api_only.get(
        f"/v1/turns/{turn['id']}", params={"wait_ms": 10000, "after_version": turn["version"] - 1}
    )
    assert r.json() == turn
    r = api_only.get(f"/v1/turns/{turn['id']}", params={"after_version": turn["version"]})
    assert r.json() == turn
    assert time.monotonic() - started < 4.0


def test_a_claimed_turn_shows_running(db_url: str) -> None:
    """Once a worker has claimed a turn, readers see RUNNING (READY -> RUNNING on claim,
    RUNNER.md), even while its first model call is still in flight."""
    slow = {**scripted({"hang_ms": 600_000}), "timeout_ms": 600_000}
    with api_client(db_url) as c:
        create_agent(c, "slow", slow)
        turn = create_turn(c, "slow")
        try:
            r = c.get(
                f"/v1/turns/{turn['id']}",
                params={"wait_ms": 8000, "after_version": turn["version"]},
            )
            now = r.json()
            assert now["status"] == "RUNNING", now
            assert now["started_at"] is not None
        finally:
            c.post(f"/v1/turns/{turn['id']}/cancel", json={})
            wait_status(c, turn["id"], "CANCELLED")


# ---- Server-Sent Events ----------------------------------------------------------------------


def read_sse(c: Any, path: str) -> tuple[str, list[dict[str, Any]]]:
    """Read a whole event stream; returns its content type and its frames."""
    frames: list[dict[str, Any]] = []
    with c.stream("GET", path, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200, r.read()
        frame: dict[str, Any] = {}
        for line in r.iter_lines():
            if not line:
                if frame:
                    frames.append(frame)
                frame = {}
                continue
            if line.startswith(":"):
                continue  # keep-alive comment
            key, _, value = line.partition(":")
            frame[key] = value.removeprefix(" ")
        if frame:
            frames.append(frame)
        return r.headers["content-type"], frames


def check_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each frame has id/event/data agreeing with each other; returns the decoded events."""
    decoded = []
    for f in frames:
        assert set(f) == {"id", "event", "data"}, f
        data = json.loads(f["data"])
        assert int(f["id"]) == data["seq"]
        assert f["event"] == data["type"]
        decoded.append(data)
    return decoded


def all_events(c: Any, turn_id: str) -> list[dict[str, Any]]:
    """The whole event log, following `after` page by page."""
    out: list[dict[str, Any]] = []
    while True:
        r = c.get(f"/v1/turns/{turn_id}/events", params={"after": out[-1]["seq"] if out else 0})
        assert r.status_code == 200
        page = r.json()["items"]
        if not page:
            return out
        out += page


def test_event_stream_follows_a_turn_until_it_is_terminal(client: Any) -> None:
    create_agent(client, "calc", CALC_THEN_ANSWER, tools=[CALCULATOR])
    turn = create_turn(client, "calc")
    stream = Background(lambda: read_sse(client, f"/v1/turns/{turn['id']}/events"))
    content_type, frames = stream.join(
        30, on_timeout=lambda: client.post(f"/v1/turns/{turn['id']}/cancel", json={})
    )
    assert content_type.startswith("text/event-stream")
    streamed = check_frames(frames)
    assert [e["seq"] for e in streamed] == list(range(1, len(streamed) + 1))
    last_move = [e for e in streamed if e["type"] == "status_changed"][-1]
    assert last_move["data"]["to"] == "COMPLETED"
    assert streamed == events(client, turn["id"])


def test_event_stream_after_seq_sends_only_later_events(client: Any) -> None:
    create_agent(
        client,
        "flaky",
        scripted({"error": {"status": 503}}, {"content": "ok"}),
        policy={"retry": {"max_retries": 0}},
    )
    turn = create_turn(client, "flaky")
    parked = wait_status(client, turn["id"], "WAITING_FOR_MODEL")
    known = events(client, turn["id"])
    after = known[-1]["seq"]
    path = f"/v1/turns/{turn['id']}/events?after={after}"
    stream = Background(lambda: read_sse(client, path))
    time.sleep(0.3)  # most likely streaming by now; the answer must be right either way
    r = client.post(
        f"/v1/turns/{turn['id']}/retry-model",
        json={"failure_id": parked["last_error"]["failure_id"]},
    )
    assert r.status_code == 202, r.text
    _, frames = stream.join(
        30, on_timeout=lambda: client.post(f"/v1/turns/{turn['id']}/cancel", json={})
    )
    streamed = check_frames(frames)
    assert streamed, "nothing streamed"
    assert [e["seq"] for e in streamed] == list(range(after + 1, after + 1 + len(streamed)))
    assert known + streamed == events(client, turn["id"])
    assert streamed[-1]["type"] == "status_changed"
    assert streamed[-1]["data"]["to"] == "COMPLETED"


def test_event_stream_of_a_finished_turn_sends_everything_and_ends(client: Any) -> None:
    create_agent(client, "calc", CALC_THEN_ANSWER, tools=[CALCULATOR])
    turn = create_turn(client, "calc")
    wait_status(client, turn["id"], "COMPLETED")
    stream = Background(lambda: read_sse(client, f"/v1/turns/{turn['id']}/events"))
    _, frames = stream.join(30)
    assert check_frames(frames) == events(client, turn["id"])
    third = events(client, turn["id"])[2]["seq"]
    stream = Background(lambda: read_sse(client, f"/v1/turns/{turn['id']}/events?after={third}"))
    _, frames = stream.join(30)
    assert check_frames(frames) == events(client, turn["id"])[3:]


def test_a_long_event_log_is_streamed_and_paged_in_full(client: Any) -> None:
    """More events than one read returns: the JSON form pages with `after`, the stream
    sends them all before it ends."""
    many_calls = {
        "tool_calls": [
            {"name": "calculator", "arguments": {"expression": f"{i}+1"}} for i in range(25)
        ]
    }
    create_agent(
        client, "busy", scripted(many_calls), tools=[CALCULATOR], policy={"max_steps": 1100}
    )
    turn = create_turn(client, "busy")
    done = wait_status(client, turn["id"], TERMINAL, timeout_s=120)
    assert done["status"] == "MAX_STEPS_REACHED", done
    first_page = events(client, turn["id"])
    log = all_events(client, turn["id"])
    assert len(log) > 1000
    assert len(first_page) < len(log)
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    stream = Background(lambda: read_sse(client, f"/v1/turns/{turn['id']}/events"))
    _, frames = stream.join(60)
    assert check_frames(frames) == log


# ---- due retries -----------------------------------------------------------------------------


def test_admin_lists_due_retries_and_retry_then_works(db_url: str) -> None:
    soon = {"retry": {"max_retries": 1, "initial_delay_ms": 1, "max_delay_ms": 1}}
    later = {"retry": {"max_retries": 1, "initial_delay_ms": 60_000}}
    with api_client(db_url, scheduler_enabled=False) as c:
        create_agent(
            c, "soon", scripted({"error": {"status": 429}}, {"content": "ok"}), policy=soon
        )
        create_agent(
            c, "later", scripted({"error": {"status": 503}}, {"content": "ok"}), policy=later
        )
        first = create_turn(c, "soon")
        wait_status(c, first["id"], "RETRY_SCHEDULED")
        second = create_turn(c, "soon")
        wait_status(c, second["id"], "RETRY_SCHEDULED")
        not_due = create_turn(c, "later")
        wait_status(c, not_due["id"], "RETRY_SCHEDULED")

        deadline = time.monotonic() + 10
        due: list[dict[str, Any]] = []
        while len(due) < 2 and time.monotonic() < deadline:
            due = c.get("/v1/admin/turns/due").json()["items"]
            time.sleep(0.02)
        assert [t["id"] for t in due] == [first["id"], second["id"]]  # oldest due first
        assert all(t["status"] == "RETRY_SCHEDULED" for t in due)
        assert due[0]["last_error"]["error_class"] == "rate_limited"
        limited = c.get("/v1/admin/turns/due", params={"limit": 1}).json()["items"]
        assert [t["id"] for t in limited] == [first["id"]]

        for t in due:
            r = c.post(f"/v1/turns/{t['id']}/retry", json={})
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "RUNNING"
        for t in due:
            assert wait_status(c, t["id"], "COMPLETED")["output"] == "ok"
        assert c.get("/v1/admin/turns/due").json()["items"] == []
        assert c.get(f"/v1/turns/{not_due['id']}").json()["status"] == "RETRY_SCHEDULED"
