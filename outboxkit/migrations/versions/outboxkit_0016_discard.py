"""outboxkit: the reset audit records discards

An operator may discard a stuck row that can never be delivered: the row is kept
with the terminal status ``discarded`` (see ``outboxkit.migrations.helpers.allow_discarded``
for the outbox tables' own CHECK), and the discard is recorded in
``outboxkit_reset_audit`` like a reset; the action's CHECK constraint gains ``discard``.
The kit's own outbox of event deliveries (``outboxkit_event_deliveries``) takes the status here.

Revision ID: outboxkit_0016
Revises: outboxkit_0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0016"
down_revision = "outboxkit_0015"
branch_labels = None
depends_on = None


_AUDIT = "outboxkit_reset_audit"
_AUDIT_CHECK = "ck_outboxkit_reset_audit_action"
_BEFORE = (
    "reset",
    "retry_now",
    "pause",
    "resume",
    "drain_now",
    "replay",
    "destination_resume",
    "destination_disable",
    "destination_probe",
    "skip",
)


def _check(actions: tuple[str, ...]) -> str:
    return "action IN (" + ", ".join(f"'{action}'" for action in actions) + ")"


_DELIVERIES = "outboxkit_event_deliveries"
_DELIVERIES_CHECK = f"ck_{_DELIVERIES}_status"


def upgrade() -> None:
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check((*_BEFORE, "discard")))
    op.drop_constraint(_DELIVERIES_CHECK, _DELIVERIES, type_="check")
    op.create_check_constraint(_DELIVERIES_CHECK, _DELIVERIES, "status IN ('pending', 'done', 'stuck', 'discarded')")
    op.create_index(f"ix_{_DELIVERIES}_discarded", _DELIVERIES, ["id"], postgresql_where=sa.text("status = 'discarded'"))


def downgrade() -> None:
    # The old constraint has no room for the discards' entries: they go (the rows stay discarded).
    op.execute(f"DELETE FROM {_AUDIT} WHERE action = 'discard'")
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check(_BEFORE))
    op.drop_index(f"ix_{_DELIVERIES}_discarded", table_name=_DELIVERIES)
    # Refused by PostgreSQL while a delivery is discarded: reset those first.
    op.drop_constraint(_DELIVERIES_CHECK, _DELIVERIES, type_="check")
    op.create_check_constraint(_DELIVERIES_CHECK, _DELIVERIES, "status IN ('pending', 'done', 'stuck')")
