"""outboxkit: a run outcome for runs whose scheduler died mid-run ('abandoned')

A leader killed mid-job left its run 'running' forever; the next leader now
marks such runs 'abandoned' when its scheduler starts.

Revision ID: outboxkit_0002
Revises: outboxkit_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "outboxkit_0002"
down_revision = "outboxkit_0001"
branch_labels = None
depends_on = None

_TABLE = "outboxkit_job_runs"
_CHECK = "ck_outboxkit_job_runs_outcome"


def upgrade() -> None:
    op.drop_constraint(_CHECK, _TABLE, type_="check")
    op.create_check_constraint(_CHECK, _TABLE, "outcome IN ('running', 'ok', 'error', 'abandoned')")


def downgrade() -> None:
    # The old constraint has no room for 'abandoned': such runs become errors, their message kept.
    op.execute(f"UPDATE {_TABLE} SET outcome = 'error' WHERE outcome = 'abandoned'")
    op.drop_constraint(_CHECK, _TABLE, type_="check")
    op.create_check_constraint(_CHECK, _TABLE, "outcome IN ('running', 'ok', 'error')")
