"""Shared fixtures: real databases (SQLite and PostgreSQL), an in-process app, real processes.

PostgreSQL comes from TURNRUNNER_TEST_POSTGRES_URL (default: the local server's `postgres`
database over TCP). Each test session creates its own database there and drops it after, and
each test starts from empty tables. Set TURNRUNNER_TEST_POSTGRES_URL=skip to run SQLite only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from app.settings import Settings
from app.store.db import Database
from app.store.migrate import upgrade
from app.store.tables import metadata
from tests.processes import free_port, stop_process, wait_http

__all__ = ["free_port", "stop_process", "wait_http"]

PG_ADMIN_URL = os.environ.get(
    "TURNRUNNER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_ENABLED = PG_ADMIN_URL != "skip"
REPO = Path(__file__).resolve().parent.parent
TURNRUNNER = [sys.executable, "-m", "app.cli"]


# ---- databases ---------------------------------------------------------------------------


def admin_engine() -> Engine:
    """A connection to the test server's maintenance database, outside any transaction."""
    return create_engine(
        PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1),
        isolation_level="AUTOCOMMIT",
    )


@contextmanager
def fresh_postgres(prefix: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database on the test server (the test is skipped when
    PostgreSQL is disabled); dropped afterwards."""
    if not PG_ENABLED:
        pytest.skip("PostgreSQL disabled (TURNRUNNER_TEST_POSTGRES_URL=skip)")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    db = Database(url)
    upgrade(db)
    db.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session."""
    with fresh_postgres("turnrunner_test") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file that each test copies (faster than migrating per test)."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    db = Database(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()
    return path


def _truncate(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database URL: each test runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "turnrunner.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("pg_url")
    _truncate(url)
    return url


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> str:
    """An empty migrated PostgreSQL database (for tests that need PostgreSQL itself)."""
    url: str = request.getfixturevalue("pg_url")
    _truncate(url)
    return url


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    yield database
    database.dispose()


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings for tests: fast polling, short leases, no demo registration side effects."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "poll_interval_ms": 50,
        "cancel_poll_interval_ms": 50,
        "lease_ttl_ms": 5000,
        "register_demo_agent": False,
    }
    values.update(overrides)
    return Settings(**values)


# ---- processes ---------------------------------------------------------------------------


@contextmanager
def run_process(
    args: list[str], env: dict[str, str], log_path: Path, health_url: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `turnrunner ARGS` as a real process; its output goes to log_path; stopped after."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*TURNRUNNER, *args], env=full_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        if health_url:
            try:
                wait_http(health_url, proc=proc)
            except Exception:
                print(log_path.read_text()[-4000:])
                raise
        yield proc
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def fake_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fake OpenAI-compatible server as a real process; yields its /v1 base URL. Tests
    isolate themselves by using their own model names."""
    port = free_port()
    log = tmp_path_factory.mktemp("fake-llm") / "fake-llm.log"
    with run_process(
        ["fake-llm", "--port", str(port)], {}, log, f"http://127.0.0.1:{port}/healthz"
    ):
        yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def api_client(db_url: str, *, worker: bool = True, **overrides: Any) -> Iterator[Any]:
    """The app in-process over a real database, with its in-process worker unless told not."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    app = create_app(make_settings(db_url, **overrides), run_worker=worker)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def client(db_url: str) -> Iterator[Any]:
    """API + in-process worker on each database."""
    with api_client(db_url) as c:
        yield c


@pytest.fixture
def api_only(db_url: str) -> Iterator[Any]:
    """API without a worker: turns stay where commands put them."""
    with api_client(db_url, worker=False) as c:
        yield c
