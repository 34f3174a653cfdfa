"""Apply the Alembic migrations; the tree lives in the `migrations` package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations
from app.store.db import Database


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def upgrade(db: Database) -> None:
    """Bring the database to the newest revision (safe to run from many processes at once)."""
    cfg = alembic_config(db.url)
    with db.engine.begin() as conn:
        if db.is_postgres:
            # Serialize concurrent migrators; the lock is released at commit.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7411)")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def is_current(db: Database) -> bool:
    """True when the database is at the newest revision."""
    head = ScriptDirectory.from_config(alembic_config(db.url)).get_current_head()
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision() == head
