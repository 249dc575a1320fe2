"""outboxkit: job run history and reset audit

Revision ID: outboxkit_0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "outboxkit_0001"
down_revision = None
branch_labels = ("outboxkit",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_job_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("job_id", sa.String(200), nullable=False),
        sa.Column("job_name", sa.String(200), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("outcome", sa.String(16), nullable=False, server_default=sa.text("'running'")),
        sa.Column("counts", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text()),
        sa.Column("leader", sa.String(300), nullable=False),
        sa.UniqueConstraint("job_id", "scheduled_for", name="uq_outboxkit_job_runs_occurrence"),
        sa.CheckConstraint("outcome IN ('running', 'ok', 'error')", name="ck_outboxkit_job_runs_outcome"),
    )
    op.create_index("ix_outboxkit_job_runs_job_started", "outboxkit_job_runs", ["job_id", "started_at"])
    op.create_table(
        "outboxkit_reset_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("outbox", sa.String(100), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("row_ids", postgresql.ARRAY(sa.BigInteger()), nullable=False, server_default=sa.text("'{}'")),
        sa.Column("filter", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.CheckConstraint("action IN ('reset', 'retry_now')", name="ck_outboxkit_reset_audit_action"),
    )
    op.create_index("ix_outboxkit_reset_audit_at", "outboxkit_reset_audit", ["at"])


def downgrade() -> None:
    op.drop_index("ix_outboxkit_reset_audit_at", table_name="outboxkit_reset_audit")
    op.drop_table("outboxkit_reset_audit")
    op.drop_index("ix_outboxkit_job_runs_job_started", table_name="outboxkit_job_runs")
    op.drop_table("outboxkit_job_runs")
