"""Subscriptions for operators: list, show with its changes, create, enable, disable, delete.

The CLI (``outboxkit subscriptions``) acts through here, on the operator
database (its time budget), with the kit's URL guard (the settings'
``OUTBOXKIT_URL_ALLOW_LIST``) and secrets.  Each change is the store's: one
transaction, audited, applied to the subscription's deliveries not yet sent
(``outboxkit.events.store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.store import Subscription, SubscriptionStore
from outboxkit.kit import OutboxKit
from outboxkit.storage.tables import subscription_audit

__all__ = ["SubscriptionAdmin"]


class SubscriptionAdmin:
    """The operator's actions on subscription rows, for one kit."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit
        self.store = SubscriptionStore(
            kit.operator_database, url_guard=kit.url_guard, secret_names=kit.settings.secrets, clock=kit.clock
        )

    def subscriptions(self, *, tenant: str | None = None) -> Sequence[Subscription]:
        return self.store.list(tenant=tenant)

    def get(self, subscription_id: int) -> Subscription:
        return self.store.get(subscription_id)

    def changes(self, subscription_id: int, *, limit: int = 20) -> list[dict[str, Any]]:
        """The subscription's audit entries, newest first (secrets counted, URL and headers redacted)."""
        statement = (
            select(subscription_audit.c.at, subscription_audit.c.actor, subscription_audit.c.action)
            .where(subscription_audit.c.subscription_id == subscription_id)
            .order_by(subscription_audit.c.id.desc())
            .limit(limit)
        )
        with self.kit.operator_database.connect() as connection:
            return [dict(row) for row in connection.execute(statement).mappings()]

    def create(self, definition: SubscriptionDefinition, *, actor: str) -> Subscription:
        return self.store.create(definition, actor=actor)

    def enable(self, subscription_id: int, *, actor: str) -> Subscription:
        return self.store.enable(subscription_id, actor=actor)

    def disable(self, subscription_id: int, *, reason: str, actor: str) -> Subscription:
        return self.store.disable(subscription_id, reason=reason, actor=actor)

    def delete(self, subscription_id: int, *, actor: str) -> None:
        self.store.delete(subscription_id, actor=actor)
