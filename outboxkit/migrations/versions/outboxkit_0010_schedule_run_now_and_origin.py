"""outboxkit: "run now" fires one occurrence without enabling a schedule; where a schedule is declared in code

``outboxkit_schedules.run_now_pending`` is set by "run now" and cleared by
the claim that fires the occurrence; a row with it set is claimed when due
even while it is disabled, and stays disabled.  The partial index of due
rows covers such rows too.

``outboxkit_schedules.declared_at`` holds where the code declares a schedule
defined in code (``module:line``), so a refused edit can say where to make it.

Revision ID: outboxkit_0010
Revises: outboxkit_0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0010"
down_revision = "outboxkit_0009"
branch_labels = None
depends_on = None


def _due_index(where: str) -> None:
    """Rebuild the partial index of due rows with ``where``."""
    op.drop_index("ix_outboxkit_schedules_due", table_name="outboxkit_schedules")
    op.create_index("ix_outboxkit_schedules_due", "outboxkit_schedules", ["next_run_at"], postgresql_where=sa.text(where))


def upgrade() -> None:
    op.add_column(
        "outboxkit_schedules",
        sa.Column("run_now_pending", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.add_column("outboxkit_schedules", sa.Column("declared_at", sa.String(300)))
    _due_index("(enabled OR run_now_pending) AND next_run_at IS NOT NULL")


def downgrade() -> None:
    _due_index("enabled AND next_run_at IS NOT NULL")
    op.drop_column("outboxkit_schedules", "declared_at")
    op.drop_column("outboxkit_schedules", "run_now_pending")
