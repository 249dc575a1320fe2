"""outboxkit: the reset audit records destination actions and ordered-delivery skips

An operator may resume, disable or probe a destination (``outboxkit_destinations``)
and skip the row at the head of an ordering key.  Each is recorded in
``outboxkit_reset_audit`` like a reset; the action's CHECK constraint gains
``destination_resume``, ``destination_disable``, ``destination_probe`` and
``skip``.

Revision ID: outboxkit_0007
Revises: outboxkit_0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "outboxkit_0007"
down_revision = "outboxkit_0006"
branch_labels = None
depends_on = None


_AUDIT = "outboxkit_reset_audit"
_AUDIT_CHECK = "ck_outboxkit_reset_audit_action"
_BEFORE = ("reset", "retry_now", "pause", "resume", "drain_now", "replay")
_ADDED = ("destination_resume", "destination_disable", "destination_probe", "skip")


def _check(actions: tuple[str, ...]) -> str:
    return "action IN (" + ", ".join(f"'{action}'" for action in actions) + ")"


def upgrade() -> None:
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check(_BEFORE + _ADDED))


def downgrade() -> None:
    # The old constraint has no room for these actions: their entries go.
    added = ", ".join(f"'{action}'" for action in _ADDED)
    op.execute(f"DELETE FROM {_AUDIT} WHERE action IN ({added})")
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, _check(_BEFORE))
