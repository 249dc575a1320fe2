"""outboxkit: the destinations' token buckets lose their deferral column

``outboxkit_destination_rates.deferred_until`` spread the rows a claim gave
back for want of a token.  The claim now takes only the rows a destination
has tokens for (``outboxkit.storage.destination_claim``), so no row is given
back and the column is written and read by nothing.  The downgrade adds it
back, empty.

Revision ID: outboxkit_0021
Revises: outboxkit_0020
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0021"
down_revision = "outboxkit_0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_column("outboxkit_destination_rates", "deferred_until")


def downgrade() -> None:
    op.add_column("outboxkit_destination_rates", sa.Column("deferred_until", sa.DateTime(timezone=True)))
