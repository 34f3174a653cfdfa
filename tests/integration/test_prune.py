"""Retention: terminal turns older than the cut-off go, with their rows; live ones stay."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from app.store.db import Database
from app.store.prune import parse_duration, prune
from app.store.tables import turn_events, turn_messages, turns
from app.store.types import utcnow
from tests.conftest import api_client
from tests.helpers import create_agent, create_turn, scripted, wait_status


def _count(db: Database, table: Any, turn_id: str) -> int:
    with db.transaction() as s:
        return int(
            s.execute(
                select(func.count()).select_from(table).where(table.c.turn_id == turn_id)
            ).scalar_one()
        )


def test_prune_removes_old_terminal_turns_only(client: Any, db: Database) -> None:
    create_agent(client, "quick", scripted({"content": "ok"}))
    old = create_turn(client, "quick")["id"]
    wait_status(client, old, "COMPLETED")
    recent = create_turn(client, "quick")["id"]
    wait_status(client, recent, "COMPLETED")
    create_agent(client, "parked", scripted({"error": {"status": 401}}))
    waiting = create_turn(client, "parked")["id"]
    wait_status(client, waiting, "WAITING_FOR_MODEL")
    long_ago = utcnow() - timedelta(days=40)
    with db.transaction() as s:
        s.execute(
            update(turns)
            .where(turns.c.id.in_([old, waiting]))
            .values(finished_at=long_ago, created_at=long_ago)
        )

    assert prune(db, timedelta(days=30), batch=1) == 1

    assert client.get(f"/v1/turns/{old}").status_code == 404
    assert _count(db, turn_messages, old) == 0
    assert _count(db, turn_events, old) == 0
    assert client.get(f"/v1/turns/{recent}").json()["status"] == "COMPLETED"
    assert client.get(f"/v1/turns/{waiting}").json()["status"] == "WAITING_FOR_MODEL"
    assert _count(db, turn_messages, recent) > 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "1y", "1.5h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_prune_setting_prunes_in_the_background(db_url: str, db: Database) -> None:
    with api_client(db_url) as client:
        create_agent(client, "quick", scripted({"content": "ok"}))
        old = create_turn(client, "quick")["id"]
        wait_status(client, old, "COMPLETED")
    with db.transaction() as s:
        s.execute(
            update(turns).where(turns.c.id == old).values(finished_at=utcnow() - timedelta(hours=2))
        )
    with api_client(db_url, worker=False, prune_after_ms=3_600_000) as client:
        deadline = time.monotonic() + 20
        while client.get(f"/v1/turns/{old}").status_code != 404:
            assert time.monotonic() < deadline, "the old turn was never pruned"
            time.sleep(0.05)
