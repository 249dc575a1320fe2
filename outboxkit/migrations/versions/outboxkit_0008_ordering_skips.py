"""outboxkit: the rows skipped at the head of their ordering key

``outboxkit_ordering_skips`` holds one row per (outbox, row id) that a person
skipped at the head of its ordering key (``outboxkit.storage.ordering``): the row
stays ``stuck`` in its outbox, never deleted, and no longer holds back the
rows of its key behind it.  The skip itself is audited in
``outboxkit_reset_audit`` (action ``skip``, allowed since ``outboxkit_0007``).

Revision ID: outboxkit_0008
Revises: outboxkit_0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0008"
down_revision = "outboxkit_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_ordering_skips",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("row_id", sa.BigInteger(), primary_key=True),
        sa.Column("skipped_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("skipped_by", sa.String(300), nullable=False),
    )


def downgrade() -> None:
    # Without the table the skipped rows would block their keys again: a downgrade is refused while any is listed.
    skipped = op.get_bind().execute(sa.text("SELECT count(*) FROM outboxkit_ordering_skips")).scalar_one()
    if skipped:
        raise RuntimeError(
            f"{skipped} row(s) are skipped at the head of their ordering key (outboxkit_ordering_skips); "
            "downgrading would block their keys again: reset or retry them first, then delete their entries"
        )
    op.drop_table("outboxkit_ordering_skips")
