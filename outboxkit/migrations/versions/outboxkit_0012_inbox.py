"""outboxkit: the inbox, the receiving side's record of handled messages

``outboxkit_inbox`` holds one row per (source, message id) a consumer has
handled, written in the consumer's own transaction (``outboxkit.inbox``), and
an index on ``received_at`` for its retention.  ``outboxkit_inbox_sources``
counts, per source, the duplicates dropped and the handler failures.

Revision ID: outboxkit_0012
Revises: outboxkit_0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0012"
down_revision = "outboxkit_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_inbox",
        sa.Column("source", sa.String(200), primary_key=True),
        sa.Column("message_id", sa.String(300), primary_key=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_outboxkit_inbox_received_at", "outboxkit_inbox", ["received_at"])
    op.create_table(
        "outboxkit_inbox_sources",
        sa.Column("source", sa.String(200), primary_key=True),
        sa.Column("duplicates", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_duplicate_at", sa.DateTime(timezone=True)),
        sa.Column("handler_failures", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_failure_at", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text()),
    )


def downgrade() -> None:
    op.drop_table("outboxkit_inbox_sources")
    op.drop_index("ix_outboxkit_inbox_received_at", table_name="outboxkit_inbox")
    op.drop_table("outboxkit_inbox")
