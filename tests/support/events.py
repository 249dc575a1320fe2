"""Events and subscriptions on one test database: a kit with the deliveries outbox, signing, and the allow-list on.

Receivers listen on 127.0.0.1, which the URL guard lets through only when allow-listed (``LOOPBACK_ALLOWED``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import standardwebhooks
from sqlalchemy import Engine, func, select, text

from outboxkit import EventDelivery, KitEvents, ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.events import SubscriptionDefinition
from outboxkit.storage.tables import events, subscription_audit, subscriptions
from tests.support.receiver import Request
from tests.support.schedules import LOOPBACK_ALLOWED

SETTINGS = OutboxKitSettings(listen_enabled=False, url_allow_list=LOOPBACK_ALLOWED)


def secret(seed: int) -> str:
    """A Standard Webhooks secret of 24 bytes, different for each ``seed``."""
    return "whsec_" + base64.b64encode(bytes([seed % 256]) * 24).decode()


def definition(url: str, *event_types: str, seed: int = 1, **options: Any) -> SubscriptionDefinition:
    return SubscriptionDefinition(url=url, event_types=list(event_types), secrets=[secret(seed)], **options)


def verified(request: Request, *secrets: str) -> bool:
    """Whether ``request`` carries a Standard Webhooks signature one of ``secrets`` checks."""
    body = json.dumps(request.body, separators=(",", ":")).encode()
    headers = {name.lower(): value for name, value in request.headers.items()}
    for candidate in secrets:
        try:
            standardwebhooks.Webhook(candidate).verify(body, headers)
            return True
        except standardwebhooks.WebhookVerificationError:
            continue
    return False


@dataclass
class EventsHarness:
    engine: Engine
    kit: OutboxKit
    events: KitEvents

    def drain(self) -> None:
        self.kit.drainer(EventDelivery).drain()

    def deliveries(self) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(select(EventDelivery.__table__).order_by(text("id"))).mappings())

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            return {
                name: connection.scalar(select(func.count()).select_from(table)) or 0
                for name, table in (
                    ("subscriptions", subscriptions), ("audit", subscription_audit), ("events", events),
                    ("deliveries", EventDelivery.__table__),
                )
            }


@pytest.fixture
def events_kit(engine: Engine, clock: ManualClock) -> Iterator[EventsHarness]:
    """A kit holding the deliveries outbox, with its ``kit.events``, on the test's database; 127.0.0.1 allowed."""
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=SETTINGS) as kit:
        yield EventsHarness(engine=engine, kit=kit, events=kit.events)


def kit_from_environment() -> OutboxKit:
    """The CLI tests' application: the deliveries outbox on ``DATABASE_URL``, 127.0.0.1 allowed."""
    import os

    from sqlalchemy import create_engine

    return OutboxKit(create_engine(os.environ["DATABASE_URL"]), [EventDelivery], settings=SETTINGS)
