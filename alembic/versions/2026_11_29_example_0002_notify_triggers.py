"""exampleapp: NOTIFY on insert into the outboxes, so the leader drains at once

Revision ID: example_0002
Revises: example_0001
Create Date: 2026-11-29

The statements come from ``outboxkit.storage.notify.install_trigger_sql``, which is
how an application installs the wake-up trigger on its own outboxes.
"""

from __future__ import annotations

from alembic import op

revision = "example_0002"
down_revision = "example_0001"
branch_labels = None
depends_on = None

OUTBOX_TABLES = ("credit_grant_outbox", "webhook_outbox")


def upgrade() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox

    from outboxkit.storage.notify import install_trigger_sql

    for outbox in (CreditGrantOutbox, WebhookOutbox):
        for statement in install_trigger_sql(outbox):
            op.execute(statement)


def downgrade() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox

    from outboxkit.storage.notify import drop_trigger_sql

    for outbox in (CreditGrantOutbox, WebhookOutbox):
        for statement in drop_trigger_sql(outbox):
            op.execute(statement)
