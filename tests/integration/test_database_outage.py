"""A database that goes away for a moment costs a retry of the step in flight, not the turn and
not the worker. The outage is real: connections to the test database are refused and the
existing ones terminated, then allowed again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from app.tools.builtins import builtin_tool_spec
from tests.conftest import admin_engine, api_client, fresh_postgres
from tests.helpers import create_agent, create_turn, events, messages, scripted, wait_status

SLEEP = builtin_tool_spec("sleep")


@pytest.fixture
def own_postgres() -> Iterator[str]:
    with fresh_postgres("turnrunner_outage") as url:
        yield url


def _connections(db_name: str, allowed: bool) -> None:
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{db_name}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
        if not allowed:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": db_name},
            )
    admin.dispose()


def test_a_turn_survives_a_database_outage_mid_step(own_postgres: str) -> None:
    db_name = own_postgres.rsplit("/", 1)[1]
    with api_client(own_postgres, lease_ttl_ms=1500) as client:
        create_agent(
            client,
            "patient",
            scripted(
                {"tool_calls": [{"name": "sleep", "arguments": {"ms": 1500}}]},
                {"content": "made it"},
            ),
            tools=[SLEEP],
        )
        turn = create_turn(client, "patient")
        deadline = time.monotonic() + 20
        while not any(e["type"] == "model_attempt" for e in events(client, turn["id"])):
            assert time.monotonic() < deadline
            time.sleep(0.02)

        # The tool is sleeping: take the database away until its step has failed to commit.
        _connections(db_name, allowed=False)
        try:
            time.sleep(2.5)
        finally:
            _connections(db_name, allowed=True)

        done = wait_status(client, turn["id"], "COMPLETED", timeout_s=30)
        log = events(client, turn["id"])

    assert done["output"] == "made it"
    # The step in flight was lost with the database; the turn was claimed again after its
    # lease ran out, and the tool ran once more (its attempt is recorded once: the one that
    # committed).
    assert [e["type"] for e in log].count("claimed") == 1
    assert [e["type"] for e in log].count("tool_attempt") == 1
    roles = [m["role"] for m in messages_of(own_postgres, turn["id"])]
    assert roles == ["user", "assistant", "tool", "assistant"]  # the lost step ran once more
    assert done["last_error"] is None


def messages_of(url: str, turn_id: str) -> list[dict[str, Any]]:
    with api_client(url, worker=False) as client:
        return messages(client, turn_id)
