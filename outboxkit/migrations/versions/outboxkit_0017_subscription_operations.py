"""outboxkit: each subscription is a destination of its own; the audit records rotations, replays and test events

A subscription's deliveries now go to a destination of their own,
``subscription <id>: <scheme://host:port>``, instead of the host's: the
breaker, the cap on sends in flight and the claim's fair turns then treat each
subscription apart, so one customer's failing or backlogged endpoint does not
hold back another's on the same host.  The upgrade renames the destination of
every subscription and of its deliveries not yet delivered; a downgrade puts
the host's back.

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
down_revision = "outboxkit_0016"
branch_labels = None
depends_on = None

_CHECK = "ck_outboxkit_subscription_audit_action"
_BEFORE = "action IN ('create', 'edit', 'enable', 'disable', 'delete')"
_AFTER = "action IN ('create', 'edit', 'enable', 'disable', 'delete', 'rotate', 'replay', 'test')"


def upgrade() -> None:
    op.execute(
        "UPDATE outboxkit_subscriptions SET destination = left('subscription ' || id || ': ' || destination, 300) "
        "WHERE destination IS NOT NULL"
    )
    op.execute(
        "UPDATE outboxkit_event_deliveries AS d SET destination = s.destination FROM outboxkit_subscriptions AS s "
        "WHERE d.subscription_id = s.id AND d.status <> 'done'"
    )
    op.drop_constraint(_CHECK, "outboxkit_subscription_audit", type_="check")
    op.create_check_constraint(_CHECK, "outboxkit_subscription_audit", _AFTER)


def downgrade() -> None:
    for table in ("outboxkit_subscriptions", "outboxkit_event_deliveries"):
        op.execute(
            f"UPDATE {table} SET destination = substring(destination FROM position(': ' IN destination) + 2) "
            "WHERE destination LIKE 'subscription %: %'"
        )
    op.execute("UPDATE outboxkit_subscription_audit SET action = 'edit' WHERE action IN ('rotate', 'replay', 'test')")
    op.drop_constraint(_CHECK, "outboxkit_subscription_audit", type_="check")
    op.create_check_constraint(_CHECK, "outboxkit_subscription_audit", _BEFORE)
