"""exampleapp: each outbox row carries its destination

The mixin's ``destination`` column (decided when a row is inserted, read by
the claim) and its index ``ix_<table>_destination_due`` on ``(destination,
next_attempt_at, id) WHERE status = 'pending'``: what autogenerate proposes
for a table made before them (tests/migrations/test_migrations.py checks
that), plus the backfill of the rows still to be sent.

Reviewed by hand: the column is nullable, so adding it rewrites nothing; the
pending rows get their destination from the models' own code
(``backfill_destinations``); the index is built with ``CREATE INDEX
CONCURRENTLY`` in an autocommit block, so a big outbox keeps taking inserts
and drains while it builds.

Revision ID: example_0004
Revises: example_0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "example_0004"
down_revision = "example_0003"
branch_labels = None
depends_on = None

OUTBOX_TABLES = ("credit_grant_outbox", "webhook_outbox")


def upgrade() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox

    from outboxkit.migrations.helpers import backfill_destinations

    for table in OUTBOX_TABLES:
        op.add_column(table, sa.Column("destination", sa.String(300), nullable=True))
    backfill_destinations(CreditGrantOutbox, WebhookOutbox)
    with op.get_context().autocommit_block():
        for table in OUTBOX_TABLES:
            op.create_index(
                f"ix_{table}_destination_due", table, ["destination", "next_attempt_at", "id"],
                postgresql_where=sa.text("status = 'pending'"), postgresql_concurrently=True,
            )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for table in OUTBOX_TABLES:
            op.drop_index(f"ix_{table}_destination_due", table_name=table, postgresql_concurrently=True)
    for table in OUTBOX_TABLES:
        op.drop_column(table, "destination")
