"""What a subscription's change does to its deliveries not yet sent: an edit redirects them, a disable holds them
(stuck, with the reason) until it is enabled, a delete parks them stuck for good; a delivery written by a publish that
overlapped the change is refused at its send.  Nothing undelivered is deleted."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from outboxkit import publish
from tests.support.events import definition, events_kit, secret, verified  # noqa: F401  (fixture)
from tests.support.receiver import Reply


def publish_one(harness, event_type: str = "invoice.paid") -> None:
    with Session(harness.engine) as session, session.begin():
        publish(session, event_type, {"n": 1})


def test_an_edit_sends_pending_deliveries_to_the_new_endpoint_with_the_new_secret(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url + "/old", "invoice.paid", seed=1), actor="a")
    publish_one(events_kit)
    store.edit(created.id, definition(receiver.url + "/new", "invoice.paid", seed=2), actor="b")
    events_kit.events.secrets.refresh_seconds = 0  # this process's signer reads the secrets again at once
    events_kit.drain()
    [request] = receiver.requests
    assert request.path == "/new" and verified(request, secret(2))


def test_a_disable_holds_pending_deliveries_and_an_enable_sends_them(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    publish_one(events_kit)
    store.disable(created.id, reason="customer asked", actor="b")
    [row] = events_kit.deliveries()
    assert row["status"] == "stuck" and row["attempts"] == 0
    assert row["last_error"] == f"held: subscription {created.id} disabled (customer asked)"
    events_kit.drain()
    assert receiver.requests == []
    store.enable(created.id, actor="c")
    events_kit.events.secrets.refresh_seconds = 0
    events_kit.drain()
    assert len(receiver.requests) == 1
    assert events_kit.deliveries()[0]["status"] == "done"


def test_an_enable_leaves_rows_stuck_for_other_reasons_alone(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    receiver.respond = lambda request: Reply(status=400)
    publish_one(events_kit)
    events_kit.drain()
    store.disable(created.id, reason="x", actor="b")
    store.enable(created.id, actor="b")
    [row] = events_kit.deliveries()
    assert (row["status"], row["last_status_code"]) == ("stuck", 400)


def test_a_delete_parks_pending_deliveries_stuck_and_keeps_them_and_the_event(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    receiver.respond = lambda request: Reply(status=200)
    publish_one(events_kit)
    events_kit.drain()
    publish_one(events_kit)
    store.delete(created.id, actor="b")
    rows = events_kit.deliveries()
    assert [(row["status"], row["last_error"]) for row in rows] == [
        ("done", None), ("stuck", f"subscription {created.id} was deleted"),
    ]
    assert events_kit.counts()["events"] == 2
    events_kit.drain()
    assert len(receiver.requests) == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda store, id: store.delete(id, actor="b"), "subscription {id} was deleted"),
        (
            lambda store, id: store.disable(id, reason="customer asked", actor="b"),
            "subscription {id} is disabled (customer asked)",
        ),
    ],
    ids=["delete", "disable"],
)
def test_a_delivery_published_across_a_change_is_refused_at_its_send(events_kit, receiver, change, reason):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.paid", {})
        change(store, created.id)  # commits while the publish is still open
    [row] = events_kit.deliveries()
    assert row["status"] == "pending"
    events_kit.drain()
    [row] = events_kit.deliveries()
    assert row["status"] == "stuck" and reason.format(id=created.id) in row["last_error"]
    assert receiver.requests == []
