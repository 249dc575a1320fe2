"""outboxkit: token buckets of destinations with a rate limit

``outboxkit_destination_rates`` holds one row per (outbox, destination) with
a rate limit (``OutboxOptions.rate_limit``): the tokens left, when they were
counted, and how far the rows given back for want of a token are spread
(``outboxkit.rate_limits``, ``outboxkit.storage.destination_claim``).

Revision ID: outboxkit_0009
Revises: outboxkit_0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0009"
down_revision = "outboxkit_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_destination_rates",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("destination", sa.String(300), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deferred_until", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("outboxkit_destination_rates")
