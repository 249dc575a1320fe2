"""outboxkit: attempt history, per-minute figures and paused outboxes

``outboxkit_attempts`` keeps every delivery attempt of every row (the
admin's row page); ``outboxkit_outbox_minutes`` the per-minute figures of
the overview's charts; ``outboxkit_outbox_pauses`` lists the outboxes whose
drains an operator paused.  The audit also records
pause, resume and "drain now".

Revision ID: outboxkit_0003
Revises: outboxkit_0002
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0003"
down_revision = "outboxkit_0002"
branch_labels = None
depends_on = None


_AUDIT = "outboxkit_reset_audit"
_AUDIT_CHECK = "ck_outboxkit_reset_audit_action"


def upgrade() -> None:
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now')")
    op.create_table(
        "outboxkit_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("row_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("status_code", sa.SmallInteger()),
        sa.Column("error", sa.Text()),
        sa.Column("sender", sa.String(300), nullable=False),
        sa.CheckConstraint("outcome IN ('done', 'retry', 'stuck', 'lost')", name="ck_outboxkit_attempts_outcome"),
    )
    op.create_index("ix_outboxkit_attempts_row", "outboxkit_attempts", ["outbox", "row_id", "attempt"])
    op.create_index("ix_outboxkit_attempts_finished", "outboxkit_attempts", ["outbox", "finished_at"])
    op.create_table(
        "outboxkit_outbox_minutes",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("delivered", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("failed", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("stuck", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("pending", sa.BigInteger()),
        sa.Column("due", sa.BigInteger()),
        sa.Column("oldest_due_seconds", sa.Float()),
    )
    op.create_table(
        "outboxkit_outbox_pauses",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("paused_by", sa.String(300), nullable=False),
    )


def downgrade() -> None:
    # The old constraint has room for row actions only: the outbox-level entries go.
    op.execute(f"DELETE FROM {_AUDIT} WHERE action IN ('pause', 'resume', 'drain_now')")
    op.drop_constraint(_AUDIT_CHECK, _AUDIT, type_="check")
    op.create_check_constraint(_AUDIT_CHECK, _AUDIT, "action IN ('reset', 'retry_now')")
    op.drop_table("outboxkit_outbox_pauses")
    op.drop_table("outboxkit_outbox_minutes")
    op.drop_index("ix_outboxkit_attempts_finished", table_name="outboxkit_attempts")
    op.drop_index("ix_outboxkit_attempts_row", table_name="outboxkit_attempts")
    op.drop_table("outboxkit_attempts")
