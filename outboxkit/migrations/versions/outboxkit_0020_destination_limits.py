"""outboxkit: limits operators set on destinations while the kit runs

``outboxkit_destination_limits`` holds one row per (outbox, destination) an
operator gave a rate limit or a cap on sends in flight of its own, from the
admin or ``outboxkit destinations limit``; every claim reads it by key
(``outboxkit.destinations.limits``, ``outboxkit.storage.destination_claim``).
A destination without a row keeps the outbox's limits from code and settings.
Each change is audited in ``outboxkit_reset_audit`` (actions
``destination_limit`` and ``destination_limit_clear``).

Revision ID: outboxkit_0020
Revises: outboxkit_0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0020"
down_revision = "outboxkit_0019"
branch_labels = None
depends_on = None

_AUDIT = "outboxkit_reset_audit"
_AUDIT_CHECK = "ck_outboxkit_reset_audit_action"
# The actions before this revision (outboxkit_0016), and the two it adds.
_BEFORE = ("reset", "retry_now", "pause", "resume", "drain_now", "replay", "destination_resume", "destination_disable",
           "destination_probe", "skip", "discard")
_ADDED = ("destination_limit", "destination_limit_clear")


def _check(actions: tuple[str, ...]) -> str:
    return "action IN (" + ", ".join(f"'{action}'" for action in actions) + ")"


def upgrade() -> None:
    op.create_table(
        "outboxkit_destination_limits",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("destination", sa.String(300), primary_key=True),
        sa.Column("per_second", sa.Float()),
        sa.Column("cap", sa.Integer()),
        sa.Column("updated_by", sa.String(200), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("per_second IS NULL OR per_second > 0", name="ck_outboxkit_destination_limits_per_second"),
        sa.CheckConstraint("cap IS NULL OR cap > 0", name="ck_outboxkit_destination_limits_cap"),
        sa.CheckConstraint("per_second IS NOT NULL OR cap IS NOT NULL", name="ck_outboxkit_destination_limits_some"),
    )
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check((*_BEFORE, *_ADDED)))


def downgrade() -> None:
    # The old constraint has no room for the limits' entries: they go with the limits themselves.
    op.execute(f"DELETE FROM {_AUDIT} WHERE action IN ('destination_limit', 'destination_limit_clear')")
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check(_BEFORE))
    op.drop_table("outboxkit_destination_limits")
