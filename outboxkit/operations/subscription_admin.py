"""Subscriptions for operators: list, show with its changes, create, edit, enable, disable, delete, rotate a secret,
replay past events and send a test event.

The CLI (``outboxkit subscriptions``) and the admin (``outboxkit.admin.subscription_api``,
``outboxkit.admin.subscription_pages``) act through here, on the operator
database (its time budget), with the kit's URL guard (the settings'
``OUTBOXKIT_URL_ALLOW_LIST``) and secrets.  Each change is the store's: one
transaction, audited, applied to the subscription's deliveries not yet sent
(``outboxkit.events.store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.deliveries import deliveries_table
from outboxkit.events.replay import EventReplay, ReplayResult
from outboxkit.events.store import Subscription, SubscriptionStore, generated_secret
from outboxkit.kit import OutboxKit
from outboxkit.operations.subscription_schemas import SubscriptionCreate, SubscriptionFields
from outboxkit.storage.tables import subscription_audit

__all__ = ["SubscriptionAdmin", "generated_secret"]


class SubscriptionAdmin:
    """The operator's actions on subscription rows, for one kit."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit
        self.replays = EventReplay(kit.operator_database, clock=kit.clock)

    @property
    def store(self) -> SubscriptionStore:
        """The store, with the kit's URL guard as it is now (a test may pin the guard's resolver on the kit)."""
        return SubscriptionStore(
            self.kit.operator_database, url_guard=self.kit.url_guard, secret_names=self.kit.settings.secrets,
            clock=self.kit.clock,
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

    def deliveries(self, subscription_id: int) -> dict[str, int]:
        """The subscription's deliveries counted by status (``pending``, ``done``, ``stuck``)."""
        table = deliveries_table()
        statement = (
            select(table.c.status, func.count()).where(table.c.subscription_id == subscription_id).group_by(table.c.status)
        )
        with self.kit.operator_database.connect() as connection:
            counted = {status: int(count) for status, count in connection.execute(statement).all()}
        return {status: counted.get(status, 0) for status in ("pending", "done", "stuck")}

    def create_from(self, fields: SubscriptionCreate, *, actor: str) -> tuple[Subscription, str | None]:
        """Create from the API's or a page's fields; without secrets one is generated and returned (shown once)."""
        generated: str | None = None
        secrets = fields.secrets
        if not secrets:
            generated = generated_secret()
            secrets = [generated]
        definition = SubscriptionDefinition(
            url=fields.url, event_types=fields.event_types, secrets=secrets, tenant=fields.tenant,
            headers=fields.headers, description=fields.description, rate_limit=fields.rate_limit,
            max_in_flight=fields.max_in_flight,
        )
        return self.store.create(definition, actor=actor), generated

    def edit(self, subscription_id: int, fields: SubscriptionFields, *, actor: str) -> Subscription:
        """Replace everything but the secrets (which are never shown, so never typed back: rotate them); limits left
        out are the deliveries outbox's own."""
        definition = SubscriptionDefinition(
            url=fields.url, event_types=fields.event_types, secrets=[_FORM_ONLY_SECRET], tenant=fields.tenant,
            headers=fields.headers, description=fields.description, rate_limit=fields.rate_limit,
            max_in_flight=fields.max_in_flight,
        )
        return self.store.edit(subscription_id, definition, actor=actor, keep_secrets=True)

    def rotate(
        self, subscription_id: int, *, actor: str, secret: str | None = None, keep_previous: bool = True
    ) -> tuple[Subscription, str]:
        return self.store.rotate_secret(subscription_id, actor=actor, secret=secret, keep_previous=keep_previous)

    def replay(
        self,
        subscription_id: int,
        *,
        since: datetime,
        until: datetime | None,
        event_types: Sequence[str] | None,
        dry_run: bool,
        actor: str,
    ) -> ReplayResult:
        return self.replays.replay(
            subscription_id, since=since, until=until, event_types=event_types, dry_run=dry_run, actor=actor
        )

    def recent_deliveries(self, subscription_id: int, *, limit: int = 50) -> list[dict[str, Any]]:
        """The subscription's deliveries, newest first (errors as the drain recorded them)."""
        table = deliveries_table()
        columns = [table.c[name] for name in (
            "id", "event_id", "event_type", "status", "attempts", "last_status_code", "last_error", "created_at",
            "delivered_at")]
        statement = select(*columns).where(table.c.subscription_id == subscription_id).order_by(table.c.id.desc()).limit(limit)
        with self.kit.operator_database.connect() as connection:
            return [dict(row) for row in connection.execute(statement).mappings()]

    def resend(self, subscription_id: int, event_id: int, *, actor: str) -> int:
        return self.replays.resend(subscription_id, event_id, actor=actor)

    def send_test(self, subscription_id: int, *, actor: str) -> int:
        return self.replays.send_test(subscription_id, actor=actor)


# Stands in for the secrets of an edit, which keeps the stored ones (``keep_secrets``) and never writes this.
_FORM_ONLY_SECRET = "whsec_" + "A" * 32
