"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "spec",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_agents")),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_name", sa.String(length=200), nullable=False),
        sa.Column("agent_version", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retry_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("consecutive_retry_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_runnable_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("iterations", sa.Integer(), server_default="0", nullable=False),
        sa.Column("steps", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tool_calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("model_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "execution_policy",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "model_override",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "last_error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "pending_tool_calls",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("message_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("event_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("inbox_pending", sa.Integer(), server_default="0", nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index("ix_turns_agent_created", ["agent_name", "created_at"], unique=False)
        batch_op.create_index(
            "ix_turns_conversation_created", ["conversation_id", "created_at"], unique=False
        )
        batch_op.create_index("ix_turns_created", ["created_at", "id"], unique=False)
        batch_op.create_index(
            "ix_turns_lease_owner",
            ["lease_owner"],
            unique=False,
            postgresql_where=sa.text("lease_owner IS NOT NULL"),
            sqlite_where=sa.text("lease_owner IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_turns_runnable",
            ["status", "next_runnable_at"],
            unique=False,
            postgresql_where=sa.text("status IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"),
            sqlite_where=sa.text("status IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"),
        )
        batch_op.create_index("ix_turns_status_created", ["status", "created_at"], unique=False)
        batch_op.create_index(
            "uq_turns_active_conversation",
            ["conversation_id"],
            unique=True,
            postgresql_where=sa.text(
                "status IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING_FOR_MODEL', 'WAITING_FOR_TOOL')"
            ),
            sqlite_where=sa.text(
                "status IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING_FOR_MODEL', 'WAITING_FOR_TOOL')"
            ),
        )

    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turns.id"],
            name=op.f("fk_idempotency_keys_turn_id_turns"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_idempotency_keys")),
    )
    op.create_table(
        "turn_events",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_turn_events_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("turn_id", "seq", name=op.f("pk_turn_events")),
    )
    op.create_table(
        "turn_inbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("message_id", sa.String(length=200), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_turn_inbox_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turn_inbox")),
        sa.UniqueConstraint("turn_id", "message_id", name=op.f("uq_turn_inbox_turn_id_message_id")),
    )
    with op.batch_alter_table("turn_inbox", schema=None) as batch_op:
        batch_op.create_index(
            "ix_turn_inbox_undelivered",
            ["turn_id"],
            unique=False,
            postgresql_where=sa.text("delivered_at IS NULL"),
            sqlite_where=sa.text("delivered_at IS NULL"),
        )

    op.create_table(
        "turn_messages",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column(
            "tool_calls",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("tool_call_id", sa.String(length=200), nullable=True),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column(
            "meta",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turns.id"],
            name=op.f("fk_turn_messages_turn_id_turns"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("turn_id", "seq", name=op.f("pk_turn_messages")),
    )
    with op.batch_alter_table("turn_messages", schema=None) as batch_op:
        batch_op.create_index("ix_turn_messages_conversation", ["conversation_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("turn_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_turn_messages_conversation")

    op.drop_table("turn_messages")
    with op.batch_alter_table("turn_inbox", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_turn_inbox_undelivered",
            postgresql_where=sa.text("delivered_at IS NULL"),
            sqlite_where=sa.text("delivered_at IS NULL"),
        )

    op.drop_table("turn_inbox")
    op.drop_table("turn_events")
    op.drop_table("idempotency_keys")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_turns_active_conversation",
            postgresql_where=sa.text(
                "status IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING_FOR_MODEL', 'WAITING_FOR_TOOL')"
            ),
            sqlite_where=sa.text(
                "status IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING_FOR_MODEL', 'WAITING_FOR_TOOL')"
            ),
        )
        batch_op.drop_index("ix_turns_status_created")
        batch_op.drop_index(
            "ix_turns_runnable",
            postgresql_where=sa.text("status IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"),
            sqlite_where=sa.text("status IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"),
        )
        batch_op.drop_index(
            "ix_turns_lease_owner",
            postgresql_where=sa.text("lease_owner IS NOT NULL"),
            sqlite_where=sa.text("lease_owner IS NOT NULL"),
        )
        batch_op.drop_index("ix_turns_created")
        batch_op.drop_index("ix_turns_conversation_created")
        batch_op.drop_index("ix_turns_agent_created")

    op.drop_table("turns")
    op.drop_table("agents")
