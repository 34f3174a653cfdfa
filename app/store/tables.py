"""The schema: agents, turns, and the append-only rows of each turn's transcript and event log."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from app.domain.status import NON_TERMINAL
from app.store.types import Json, UTCDateTime

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_non_terminal = "status IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(NON_TERMINAL)))
_runnable = "status IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"

agents = Table(
    "agents",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("spec", Json, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

turns = Table(
    "turns",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent_name", String(200), nullable=False),
    Column("agent_version", Integer, nullable=False),
    Column("conversation_id", String(200), nullable=False),
    Column("status", String(32), nullable=False),
    Column("status_reason", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("retry_count", Integer, nullable=False, server_default="0"),
    Column("consecutive_retry_count", Integer, nullable=False, server_default="0"),
    Column("next_runnable_at", UTCDateTime),
    Column("iterations", Integer, nullable=False, server_default="0"),
    Column("steps", Integer, nullable=False, server_default="0"),
    Column("tool_calls", Integer, nullable=False, server_default="0"),
    Column("model_attempts", Integer, nullable=False, server_default="0"),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("execution_policy", Json, nullable=False),
    # A model chosen by retry-model for the rest of the turn; NULL = the agent's.
    Column("model_override", Json),
    Column("last_error", Json),
    Column("pending_tool_calls", Json, nullable=False),
    Column("output", Text),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("cancel_reason", Text),
    Column("metadata", Json, nullable=False),
    Column("version", Integer, nullable=False, server_default="1"),
    # Per-turn sequence counters; bumped in the same UPDATE that appends, so rows of one turn
    # are numbered in commit order and readers polling `after=SEQ` never miss one.
    Column("message_count", Integer, nullable=False, server_default="0"),
    Column("event_count", Integer, nullable=False, server_default="0"),
    # User messages queued for a turn a worker holds; delivered before its next model call.
    Column("inbox_pending", Integer, nullable=False, server_default="0"),
    Column("lease_owner", String(200)),
    Column("lease_token", String(64)),
    Column("lease_expires_at", UTCDateTime),
    Index("ix_turns_created", "created_at", "id"),
    Index("ix_turns_agent_created", "agent_name", "created_at"),
    Index("ix_turns_status_created", "status", "created_at"),
    Index("ix_turns_conversation_created", "conversation_id", "created_at"),
    # The runnable set: claims scan only live turns.
    Index(
        "ix_turns_runnable",
        "status",
        "next_runnable_at",
        postgresql_where=text(_runnable),
        sqlite_where=text(_runnable),
    ),
    Index(
        "ix_turns_lease_owner",
        "lease_owner",
        postgresql_where=text("lease_owner IS NOT NULL"),
        sqlite_where=text("lease_owner IS NOT NULL"),
    ),
    # At most one non-terminal turn per conversation, kept by the database, not by Python.
    Index(
        "uq_turns_active_conversation",
        "conversation_id",
        unique=True,
        postgresql_where=text(_non_terminal),
        sqlite_where=text(_non_terminal),
    ),
)

turn_messages = Table(
    "turn_messages",
    metadata,
    Column("turn_id", String(64), ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("conversation_id", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text),
    Column("tool_calls", Json),
    Column("tool_call_id", String(200)),
    Column("name", String(200)),
    Column("meta", Json),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_turn_messages_conversation", "conversation_id"),
)

turn_events = Table(
    "turn_events",
    metadata,
    Column("turn_id", String(64), ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("type", String(64), nullable=False),
    Column("data", Json, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

turn_inbox = Table(
    "turn_inbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("turn_id", String(64), ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    Column("message_id", String(200), nullable=False),
    Column("content", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("delivered_at", UTCDateTime),
    UniqueConstraint("turn_id", "message_id"),
    Index(
        "ix_turn_inbox_undelivered",
        "turn_id",
        postgresql_where=text("delivered_at IS NULL"),
        sqlite_where=text("delivered_at IS NULL"),
    ),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("turn_id", String(64), ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)
