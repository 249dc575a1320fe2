"""The kit builds its events side itself when EventDelivery is registered: every delivery is signed in every
process that builds the kit (nothing else to call), and again after ``kit.close()``; ``KitEvents(kit)`` still
works, warns, and shares the kit's own."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from outboxkit import EventDelivery, KitEvents, OutboxKit, publish
from tests.support.events import SETTINGS, definition, secret, verified


def _publish(engine, event_type: str = "invoice.paid") -> None:
    with Session(engine) as session, session.begin():
        publish(session, event_type, {"invoice": 1})


def test_a_kit_with_the_deliveries_outbox_signs_without_any_other_call(engine, clock, receiver):
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=SETTINGS) as setup:
        setup.events.subscriptions.create(definition(receiver.url, "invoice.paid", seed=4), actor="a")
    _publish(engine)
    # A second process (the worker) builds the kit and drains: it never touches kit.events.
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=SETTINGS) as worker:
        worker.drainer(EventDelivery).drain()
    [request] = receiver.requests
    assert verified(request, secret(4))


def test_the_kit_signs_again_after_close(engine, clock, receiver):
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=SETTINGS) as kit:
        kit.events.subscriptions.create(definition(receiver.url, "invoice.paid", seed=5), actor="a")
        kit.close()  # drainers and the transport are rebuilt on the next drain
        _publish(engine)
        kit.drainer(EventDelivery).drain()
    [request] = receiver.requests
    assert verified(request, secret(5))


def test_building_kit_events_by_hand_warns_and_shares_the_kits_own(engine, clock):
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=SETTINGS) as kit:
        with pytest.warns(DeprecationWarning, match=r"Use kit\.events"):
            events = KitEvents(kit)
        assert events.subscriptions is kit.events.subscriptions and events.secrets is kit.events.secrets
