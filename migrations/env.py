"""Alembic environment: one migration tree for PostgreSQL and SQLite."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.store.db import make_engine
from app.store.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from app.settings import get_settings

        url = get_settings().database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
