"""exampleapp: the due index keyed by (next_attempt_at, id), and the in-flight index

After the outbox mixin's indexes changed, autogenerate proposes exactly these
changes per outbox table (tests/migrations/test_migrations.py checks that):

* ``ix_<table>_due_id`` on ``(next_attempt_at, id) WHERE status = 'pending'``
  replaces ``ix_<table>_due`` (``next_attempt_at`` alone).  The claim orders
  by both columns, so with the old index every group of rows sharing one due
  time (a bulk insert, a bulk reset) was read and sorted on each claim;
* ``ix_<table>_claimed`` on ``claimed_until WHERE claimed_until IS NOT NULL``
  serves the admin's in-flight count.

Reviewed by hand: both are built with ``CREATE INDEX CONCURRENTLY`` (which
cannot run inside a transaction, hence the autocommit block), so a big outbox
keeps taking inserts and drains while they build; the old index is dropped
only once the new one exists, so the drain always has an index.  If a concurrent build
fails it leaves an INVALID index behind: drop it and run the upgrade again.

Revision ID: example_0003
Revises: example_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "example_0003"
down_revision = "example_0002"
branch_labels = None
depends_on = None

OUTBOX_TABLES = ("credit_grant_outbox", "webhook_outbox")


def create_index_concurrently(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(name, table, columns, postgresql_where=sa.text(where), postgresql_concurrently=True)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for table in OUTBOX_TABLES:
            create_index_concurrently(f"ix_{table}_due_id", table, ["next_attempt_at", "id"], "status = 'pending'")
            create_index_concurrently(f"ix_{table}_claimed", table, ["claimed_until"], "claimed_until IS NOT NULL")
            op.drop_index(f"ix_{table}_due", table_name=table, postgresql_concurrently=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for table in OUTBOX_TABLES:
            create_index_concurrently(f"ix_{table}_due", table, ["next_attempt_at"], "status = 'pending'")
            op.drop_index(f"ix_{table}_claimed", table_name=table, postgresql_concurrently=True)
            op.drop_index(f"ix_{table}_due_id", table_name=table, postgresql_concurrently=True)
