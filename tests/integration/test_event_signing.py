"""The signer reads each subscription's secrets from the database and keeps them ``refresh_seconds``; a rotation
reaches the sends once they are read again; a request that is not a subscription's delivery is refused, unsent."""

from __future__ import annotations

import pytest

from outboxkit import CallableTransport, ConfigurationError, Delivery, EventDelivery, OutboxKit
from outboxkit.events import SubscriptionSecrets, SubscriptionSigningTransport
from outboxkit.policy import FailureKind
from outboxkit.transports.guarded import GuardedTransport
from tests.support.events import SETTINGS, definition, events_kit  # noqa: F401  (fixture)
from tests.support.models import SampleEvent


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_secrets_are_kept_for_refresh_seconds_then_read_again(events_kit):
    store = events_kit.events.subscriptions
    created = store.create(definition("http://127.0.0.1:9/", "invoice.paid", seed=1), actor="a")
    ticks = Ticks()
    secrets = SubscriptionSecrets(events_kit.engine, refresh_seconds=5, monotonic=ticks)
    first, refusal = secrets.lookup(created.id)
    assert refusal is None and first is not None
    store.edit(created.id, definition("http://127.0.0.1:9/", "invoice.paid", seed=2), actor="a")
    ticks.now += 4.9
    assert secrets.lookup(created.id)[0] is first
    ticks.now += 0.2
    rotated, _ = secrets.lookup(created.id)
    assert rotated is not first
    assert rotated is not None and rotated.signature("id", 1, b"") != first.signature("id", 1, b"")


def test_a_request_that_is_not_a_subscriptions_delivery_is_refused_unsent(events_kit):
    sent: list[Delivery] = []
    signer = SubscriptionSigningTransport(
        CallableTransport(lambda delivery, key: sent.append(delivery) or 200), events_kit.events.secrets
    )
    result = signer.send(Delivery(url="http://127.0.0.1:9/"), idempotency_key="k", timeout=5)
    assert result.failure is FailureKind.REFUSED and "not a delivery of a subscription" in (result.error or "")
    assert sent == []


def test_kit_events_needs_the_deliveries_outbox_registered(engine, clock):
    with OutboxKit(engine, [SampleEvent], clock=clock, settings=SETTINGS) as kit:
        with pytest.raises(ConfigurationError, match=r"OutboxKit\(engine, outboxes=\[\.\.\., EventDelivery\]\)"):
            kit.events  # noqa: B018


def test_kit_events_signs_under_the_url_guard_of_the_deliveries_drainer(events_kit):
    sending = events_kit.kit.drainer(EventDelivery).transport
    assert isinstance(sending, GuardedTransport) and isinstance(sending.transport, SubscriptionSigningTransport)
