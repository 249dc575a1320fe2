"""outboxkit: the reset audit records replays

A replay (``outboxkit.operations.replay``) sends delivered rows again and
records each of its batches in ``outboxkit_reset_audit`` with the action
``replay``; the action's CHECK constraint gains that value.

Revision ID: outboxkit_0004
Revises: outboxkit_0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "outboxkit_0004"
down_revision = "outboxkit_0003"
branch_labels = None
depends_on = None


_AUDIT = "outboxkit_reset_audit"
_AUDIT_CHECK = "ck_outboxkit_reset_audit_action"


def upgrade() -> None:
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(
        _AUDIT_CHECK, _AUDIT, "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now', 'replay')"
    )


def downgrade() -> None:
    # The old constraint has no room for replays: their entries go.
    op.execute(f"DELETE FROM {_AUDIT} WHERE action = 'replay'")
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now')")
