"""outboxkit: destination state read by the claim; the event deliveries carry their destination

Rows now carry their destination and the claim leaves out the rows of a
blocked destination, so no row is held back with a due time any more: the
``held_until`` column of ``outboxkit_destinations`` goes.  The partial index
``ix_outboxkit_destinations_blocked`` holds the states that are not healthy
or carry a slow-down, which the ordered claim reads to find its probes and
the earliest due time of blocked destinations, whatever the number of
healthy states stored.

Rows held back before this upgrade keep the due time they were given (at
most the cool-down, or the slow-down, they waited for); a disabled
destination's held rows, due years away, are due again when it is resumed:
run ``UPDATE <outbox> SET next_attempt_at = now() WHERE status = 'pending'
AND next_attempt_at > now() + interval '1 year'`` after the upgrade if you
had one.

Revision ID: outboxkit_0014
Revises: outboxkit_0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0014"
down_revision = "outboxkit_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The kit's own outbox (event deliveries) carries its destination like every outbox; a delivery's is its
    # subscription's, written by publish.
    op.add_column("outboxkit_event_deliveries", sa.Column("destination", sa.String(300), nullable=True))
    op.add_column("outboxkit_subscriptions", sa.Column("destination", sa.String(300), nullable=True))
    op.create_index(
        "ix_outboxkit_event_deliveries_destination_due", "outboxkit_event_deliveries",
        ["destination", "next_attempt_at", "id"], postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_column("outboxkit_destinations", "held_until")
    op.create_index(
        "ix_outboxkit_destinations_blocked", "outboxkit_destinations", ["outbox"],
        postgresql_where=sa.text("status <> 'healthy' OR slowed_until IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_outboxkit_event_deliveries_destination_due", table_name="outboxkit_event_deliveries")
    op.drop_column("outboxkit_event_deliveries", "destination")
    op.drop_column("outboxkit_subscriptions", "destination")
    op.drop_index("ix_outboxkit_destinations_blocked", table_name="outboxkit_destinations")
    op.add_column("outboxkit_destinations", sa.Column("held_until", sa.DateTime(timezone=True)))
