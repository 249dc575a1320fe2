"""outboxkit: the subscription audit records secret rotations, replays and test events

``outboxkit_subscription_audit.action`` takes three more values: ``rotate``
(a new signing secret), ``replay`` (past events enqueued again to one
subscription, with the filter and the count) and ``test`` (a test event sent
to one subscription).  A downgrade keeps those entries, recorded as ``edit``
(their ``before`` and ``after`` still say what happened).

Revision ID: outboxkit_0017
Revises: outboxkit_0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "outboxkit_0017"
down_revision = "outboxkit_0014"
branch_labels = None
depends_on = None

_CHECK = "ck_outboxkit_subscription_audit_action"
_BEFORE = "action IN ('create', 'edit', 'enable', 'disable', 'delete')"
_AFTER = "action IN ('create', 'edit', 'enable', 'disable', 'delete', 'rotate', 'replay', 'test')"


def upgrade() -> None:
    op.drop_constraint(_CHECK, "outboxkit_subscription_audit", type_="check")
    op.create_check_constraint(_CHECK, "outboxkit_subscription_audit", _AFTER)


def downgrade() -> None:
    op.execute("UPDATE outboxkit_subscription_audit SET action = 'edit' WHERE action IN ('rotate', 'replay', 'test')")
    op.drop_constraint(_CHECK, "outboxkit_subscription_audit", type_="check")
    op.create_check_constraint(_CHECK, "outboxkit_subscription_audit", _BEFORE)
