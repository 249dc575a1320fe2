"""An admin app for the subscription pages and API: the admin router behind HTTP Basic, over a kit that
registers the deliveries outbox (``EventDelivery``), with 127.0.0.1 allow-listed for the test receivers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from exampleapp.admin_app import require_admin
from exampleapp.models import WebhookOutbox
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from outboxkit import Clock, EventDelivery, OutboxKit, OutboxKitSettings
from outboxkit.admin import create_admin_router
from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER
from tests.support.database import sqlalchemy_url
from tests.support.schedules import LOOPBACK_ALLOWED

CSRF_SECRET = "subscription-admin-tests-csrf-secret"
SUBSCRIPTION_TABLES = (
    "outboxkit_event_deliveries", "outboxkit_events", "outboxkit_subscription_audit", "outboxkit_subscriptions",
    "outboxkit_destination_limits",  # a subscription's own limits are its destination's
)


@dataclass
class SubscriptionAdminApp:
    app: FastAPI
    client: TestClient
    kit: OutboxKit
    engine: Engine

    def clear(self) -> None:
        """Empty the events' tables (DELETE: cheap on small tables) and the client's cookies."""
        with self.engine.begin() as connection:
            for table in SUBSCRIPTION_TABLES:
                connection.execute(text(f"DELETE FROM {table}"))
        self.client.cookies.clear()

    def state(self) -> list[tuple[Any, ...]]:
        """Every subscription, audit entry, event and delivery: equal states mean nothing changed."""
        with self.engine.connect() as connection:
            return [
                (table, *[tuple(row) for row in connection.execute(text(f"SELECT * FROM {table} ORDER BY 1"))])
                for table in SUBSCRIPTION_TABLES
            ]


@contextmanager
def subscription_admin_app(
    database_url: str, *, clock: Clock | None = None, settings: OutboxKitSettings | None = None
) -> Iterator[SubscriptionAdminApp]:
    """``settings`` default to the test receivers' allow-list (127.0.0.1)."""
    engine = create_engine(sqlalchemy_url(database_url), pool_size=3, max_overflow=0, pool_pre_ping=True)
    settings = settings or OutboxKitSettings(listen_enabled=False, url_allow_list=LOOPBACK_ALLOWED)
    kit = OutboxKit(engine, [WebhookOutbox, EventDelivery], clock=clock, settings=settings)
    app = FastAPI(title="subscription admin tests")
    app.include_router(
        create_admin_router(kit, dependencies=[Depends(require_admin(ADMIN_USER, ADMIN_PASSWORD))], csrf_secret=CSRF_SECRET),
        prefix="/admin",
    )
    try:
        with TestClient(app, follow_redirects=False) as client:
            client.auth = (ADMIN_USER, ADMIN_PASSWORD)
            yield SubscriptionAdminApp(app=app, client=client, kit=kit, engine=engine)
    finally:
        kit.close()
        engine.dispose()
