"""exampleapp: outbox rows may be discarded

A person may discard a stuck row that can never be delivered: it is kept, with
the terminal status ``discarded``.  The outbox tables' ``status`` CHECK takes
the new status (``allow_discarded``; autogenerate does not compare CHECK
constraints, so this revision is written by hand).

Revision ID: example_0005
Revises: example_0004
Create Date: 2026-12-05
"""

from __future__ import annotations

revision = "example_0005"
down_revision = "example_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox

    from outboxkit.migrations.helpers import allow_discarded

    allow_discarded(CreditGrantOutbox, WebhookOutbox)


def downgrade() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox

    from outboxkit.migrations.helpers import forbid_discarded

    forbid_discarded(CreditGrantOutbox, WebhookOutbox)
