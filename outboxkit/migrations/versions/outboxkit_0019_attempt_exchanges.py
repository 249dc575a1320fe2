"""outboxkit: each attempt keeps what it sent and what came back; a reset leaves a marker in the history

``outboxkit_attempts`` gains ``request`` and ``response`` (JSONB, nullable:
attempts recorded before keep none), and its outcome CHECK takes ``reset``,
the marker a reset or a replay writes so that a row's attempts count on
across resets.  Adding nullable columns rewrites nothing; the new CHECK is
added ``NOT VALID`` and then validated, which reads the table without
holding up the drains' inserts.

Revision ID: outboxkit_0019
Revises: outboxkit_0018
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from alembic import op

revision = "outboxkit_0019"
down_revision = "outboxkit_0018"
branch_labels = None
depends_on = None

_TABLE = "outboxkit_attempts"
_CHECK = "ck_outboxkit_attempts_outcome"
_BEFORE = "outcome IN ('done', 'retry', 'stuck', 'lost')"
_AFTER = "outcome IN ('done', 'retry', 'stuck', 'lost', 'reset')"


def _replace_check(condition: str) -> None:
    op.drop_constraint(_CHECK, _TABLE, type_="check")
    op.execute(f"ALTER TABLE {_TABLE} ADD CONSTRAINT {_CHECK} CHECK ({condition}) NOT VALID")
    op.execute(f"ALTER TABLE {_TABLE} VALIDATE CONSTRAINT {_CHECK}")


def upgrade() -> None:
    op.add_column(_TABLE, sa.Column("request", JSONB()))
    op.add_column(_TABLE, sa.Column("response", JSONB()))
    _replace_check(_AFTER)


def downgrade() -> None:
    # The old constraint has no room for the reset markers: they go (the attempts stay).
    op.execute(f"DELETE FROM {_TABLE} WHERE outcome = 'reset'")
    _replace_check(_BEFORE)
    op.drop_column(_TABLE, "response")
    op.drop_column(_TABLE, "request")
