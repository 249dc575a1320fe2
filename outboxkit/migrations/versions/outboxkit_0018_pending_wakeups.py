"""outboxkit: pending wake-ups, so an outbox's inserts notify once per wake-up, not once per transaction

``outboxkit_wakeups`` holds a row per outbox channel while a wake-up is
pending (``outboxkit.storage.wakeups``).  The insert triggers that use it are
the applications' (``install_notify_triggers``): after this revision, add one
of your own that calls ``install_notify_triggers(...)`` again for your
outboxes, which replaces each trigger's function.  Until then the old
triggers notify on every insert, as before; the kit's own outbox's trigger is
replaced here.

Revision ID: outboxkit_0018
Revises: outboxkit_0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from outboxkit.storage.wakeups import trigger_body

revision = "outboxkit_0018"
down_revision = "outboxkit_0017"
branch_labels = None
depends_on = None

# The kit's own outbox (event deliveries): its trigger's function, as outboxkit_0013 created it.
DELIVERIES = "outboxkit_event_deliveries"
NOTIFY_FUNCTION = '"outboxkit_notify_outboxkit_event_deliveries"'
EVERY_INSERT = f"""BEGIN
    PERFORM pg_notify('{DELIVERIES}', '');
    RETURN NULL;
END"""


def _replace_function(body: str) -> None:
    op.execute(f"CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n{body}\n$$")


def upgrade() -> None:
    op.create_table(
        "outboxkit_wakeups",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("channel", sa.String(63), nullable=False),
    )
    op.create_index("ix_outboxkit_wakeups_channel", "outboxkit_wakeups", ["channel"])
    _replace_function(trigger_body(DELIVERIES))


def downgrade() -> None:
    _replace_function(EVERY_INSERT)
    op.drop_index("ix_outboxkit_wakeups_channel", table_name="outboxkit_wakeups")
    op.drop_table("outboxkit_wakeups")
