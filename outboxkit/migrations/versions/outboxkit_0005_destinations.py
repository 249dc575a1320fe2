"""outboxkit: destination state (the circuit breaker of each destination of each outbox)

``outboxkit_destinations`` holds one row per (outbox, destination): the
breaker's status, its failure run, recent outcome counts, when it opened, the
next probe, the hold its waiting rows carry, the last error
(``outboxkit.breaker``, ``outboxkit.destinations.store``).

Revision ID: outboxkit_0005
Revises: outboxkit_0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "outboxkit_0005"
down_revision = "outboxkit_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outboxkit_destinations",
        sa.Column("outbox", sa.String(100), primary_key=True),
        sa.Column("destination", sa.String(300), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False, server_default=sa.text("'healthy'")),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("window_started_at", sa.DateTime(timezone=True)),
        sa.Column("window_successes", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("window_failures", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("opened_at", sa.DateTime(timezone=True)),
        sa.Column("cool_down", sa.Float()),
        sa.Column("next_probe_at", sa.DateTime(timezone=True)),
        sa.Column("probe_row_id", sa.BigInteger()),
        sa.Column("probe_until", sa.DateTime(timezone=True)),
        sa.Column("held_until", sa.DateTime(timezone=True)),
        sa.Column("slowed_until", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text()),
        sa.Column("last_status_code", sa.SmallInteger()),
        sa.Column("last_failure_at", sa.DateTime(timezone=True)),
        sa.Column("last_success_at", sa.DateTime(timezone=True)),
        sa.Column("changed_by", sa.String(300)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint(
            "status IN ('healthy', 'open', 'half_open', 'disabled')", name="ck_outboxkit_destinations_status"
        ),
    )


def downgrade() -> None:
    op.drop_table("outboxkit_destinations")
