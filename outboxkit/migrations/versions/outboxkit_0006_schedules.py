"""outboxkit: schedules as rows, their leases and audit, and the outcomes 'missed' and 'enqueued'

``outboxkit_schedules`` holds runtime-editable schedules (trigger as data,
a Python job or an HTTP call as target); ``outboxkit_schedule_leases`` one
row per run of a Python job in progress; ``outboxkit_schedule_audit`` every
change to a schedule.  The run history gains ``missed``
(an occurrence not run, recorded instead of dropped) and ``enqueued`` (an
HTTP occurrence written into its outbox).

Revision ID: outboxkit_0006
Revises: outboxkit_0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "outboxkit_0006"
down_revision = "outboxkit_0005"
branch_labels = None
depends_on = None

_RUNS = "outboxkit_job_runs"
_RUNS_CHECK = "ck_outboxkit_job_runs_outcome"


def upgrade() -> None:
    op.drop_constraint(_RUNS_CHECK, _RUNS, type_="check")
    op.create_check_constraint(
        _RUNS_CHECK, _RUNS, "outcome IN ('running', 'ok', 'error', 'abandoned', 'missed', 'enqueued')"
    )
    op.create_table(
        "outboxkit_schedules",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("trigger_kind", sa.String(24), nullable=False),
        sa.Column("trigger_fields", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("timezone", sa.String(64), nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("target_kind", sa.String(8), nullable=False),
        sa.Column("job", sa.String(200)),
        sa.Column("http_outbox", sa.String(100)),
        sa.Column("http_method", sa.String(8)),
        sa.Column("http_url", sa.Text()),
        sa.Column("http_headers", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("http_body", postgresql.JSONB()),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column("next_run_at", sa.DateTime(timezone=True)),
        sa.Column("misfire_grace_seconds", sa.Integer(), nullable=False, server_default=sa.text("300")),
        sa.Column("max_running", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("rerun_if_abandoned", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("defined_in", sa.String(8), nullable=False, server_default=sa.text("'api'")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("created_by", sa.String(300), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("changed_by", sa.String(300), nullable=False),
        sa.UniqueConstraint("name", name="uq_outboxkit_schedules_name"),
        sa.CheckConstraint(
            "trigger_kind IN ('cron', 'every', 'calendar_interval', 'once')", name="ck_outboxkit_schedules_trigger_kind"
        ),
        sa.CheckConstraint(
            "(target_kind = 'job' AND job IS NOT NULL AND http_url IS NULL) OR "
            "(target_kind = 'http' AND job IS NULL AND http_url IS NOT NULL AND http_method IS NOT NULL "
            "AND http_outbox IS NOT NULL)",
            name="ck_outboxkit_schedules_target",
        ),
        sa.CheckConstraint("misfire_grace_seconds >= 0", name="ck_outboxkit_schedules_grace"),
        sa.CheckConstraint("max_running >= 1", name="ck_outboxkit_schedules_max_running"),
        sa.CheckConstraint("defined_in IN ('code', 'api')", name="ck_outboxkit_schedules_defined_in"),
    )
    op.create_index(
        "ix_outboxkit_schedules_due",
        "outboxkit_schedules",
        ["next_run_at"],
        postgresql_where=sa.text("enabled AND next_run_at IS NOT NULL"),
    )
    op.create_table(
        "outboxkit_schedule_leases",
        sa.Column("token", sa.Uuid(), primary_key=True),
        sa.Column(
            "schedule_id",
            sa.BigInteger(),
            sa.ForeignKey("outboxkit_schedules.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=False),
        sa.Column("holder", sa.String(300), nullable=False),
        sa.Column("attempt", sa.SmallInteger(), nullable=False, server_default=sa.text("1")),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("attempt IN (1, 2)", name="ck_outboxkit_schedule_leases_attempt"),
    )
    op.create_index("ix_outboxkit_schedule_leases_schedule", "outboxkit_schedule_leases", ["schedule_id"])
    op.create_index("ix_outboxkit_schedule_leases_expires", "outboxkit_schedule_leases", ["expires_at"])
    op.create_table(
        "outboxkit_schedule_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("schedule", sa.String(200), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("before", postgresql.JSONB()),
        sa.Column("after", postgresql.JSONB()),
        sa.CheckConstraint(
            "action IN ('create', 'edit', 'enable', 'disable', 'run_now', 'delete', 'sync')",
            name="ck_outboxkit_schedule_audit_action",
        ),
    )
    op.create_index("ix_outboxkit_schedule_audit_schedule_at", "outboxkit_schedule_audit", ["schedule", "at"])


def downgrade() -> None:
    op.drop_index("ix_outboxkit_schedule_audit_schedule_at", table_name="outboxkit_schedule_audit")
    op.drop_table("outboxkit_schedule_audit")
    op.drop_index("ix_outboxkit_schedule_leases_expires", table_name="outboxkit_schedule_leases")
    op.drop_index("ix_outboxkit_schedule_leases_schedule", table_name="outboxkit_schedule_leases")
    op.drop_table("outboxkit_schedule_leases")
    op.drop_index("ix_outboxkit_schedules_due", table_name="outboxkit_schedules")
    op.drop_table("outboxkit_schedules")
    # The old constraint has no room for the schedules' outcomes: their history rows go.
    op.execute(f"DELETE FROM {_RUNS} WHERE outcome IN ('missed', 'enqueued')")
    op.drop_constraint(_RUNS_CHECK, _RUNS, type_="check")
    op.create_check_constraint(_RUNS_CHECK, _RUNS, "outcome IN ('running', 'ok', 'error', 'abandoned')")
