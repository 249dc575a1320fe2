"""outboxkit: the fence of fired occurrences, kept apart from the capped run history

``outboxkit_job_fences`` holds one row per job or schedule: every occurrence
at or before ``fired_through`` counts as fired.  The trim of the run history
moves it past the runs it deletes, so a trimmed run's occurrence can never
fire again (a late process that still holds it is refused); a newer
occurrence is fenced by its own history row, as before.  Nothing is
backfilled: a job's row appears with its next fired occurrence or trim.

Revision ID: outboxkit_0015
Revises: outboxkit_0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0015"
down_revision = "outboxkit_0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_job_fences",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("fired_through", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("outboxkit_job_fences")
