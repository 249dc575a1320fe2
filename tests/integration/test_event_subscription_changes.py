"""What a subscription's change does to its deliveries not yet sent: an edit redirects them, a disable holds them
(stuck, with the reason) until it is enabled, a delete parks them stuck for good.  A change waits for a publish in
progress and then applies to its deliveries too; a delivery whose subscription was changed by hand is refused at its
send.  Nothing undelivered is deleted."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text
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


def wait_for_a_lock_wait(engine) -> None:
    """Until some other session of the database waits for a row lock."""
    deadline = time.monotonic() + 30
    query = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            if connection.scalar(query):
                return
        time.sleep(0.01)
    raise AssertionError("no session waited for a lock within 30 s")


CHANGES = [
    (lambda store, id: store.delete(id, actor="b"), "subscription {id} was deleted"),
    (
        lambda store, id: store.disable(id, reason="customer asked", actor="b"),
        "held: subscription {id} disabled (customer asked)",
    ),
]


@pytest.mark.parametrize(("change", "reason"), CHANGES, ids=["delete", "disable"])
def test_a_change_waits_for_a_publish_in_progress_and_then_holds_its_deliveries(events_kit, receiver, change, reason):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with Session(events_kit.engine) as session, session.begin():
            publish(session, "invoice.paid", {})
            changing = pool.submit(change, store, created.id)
            wait_for_a_lock_wait(events_kit.engine)  # the change waits for the publish's lock on the subscription
            assert not changing.done()
        changing.result(timeout=30)
    [row] = events_kit.deliveries()
    assert row["status"] == "stuck" and row["last_error"] == reason.format(id=created.id)
    events_kit.drain()
    assert receiver.requests == []


def test_an_edit_waits_for_a_publish_in_progress_and_then_redirects_its_deliveries(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url + "/old", "invoice.paid"), actor="a")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with Session(events_kit.engine) as session, session.begin():
            publish(session, "invoice.paid", {})
            editing = pool.submit(store.edit, created.id, definition(receiver.url + "/new", "invoice.paid"), actor="b")
            wait_for_a_lock_wait(events_kit.engine)
        editing.result(timeout=30)
    events_kit.drain()
    assert [request.path for request in receiver.requests] == ["/new"]


def test_a_publish_that_meets_a_change_in_progress_waits_and_sees_it(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with events_kit.engine.begin() as connection:  # a change in progress: the store's lock, held
            connection.execute(text("SELECT 1 FROM outboxkit_subscriptions WHERE id = :id FOR UPDATE"), {"id": created.id})
            connection.execute(text("UPDATE outboxkit_subscriptions SET enabled = false, disabled_reason = 'x' WHERE id = :id"),
                               {"id": created.id})

            def publish_one_event() -> int:
                with Session(events_kit.engine) as session, session.begin():
                    return publish(session, "invoice.paid", {}).deliveries

            publishing = pool.submit(publish_one_event)
            wait_for_a_lock_wait(events_kit.engine)
        assert publishing.result(timeout=30) == 0


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("DELETE FROM outboxkit_subscriptions WHERE id = :id", "subscription {id} was deleted"),
        ("UPDATE outboxkit_subscriptions SET enabled = false, disabled_reason = 'by hand' WHERE id = :id",
         "subscription {id} is disabled (by hand)"),
    ],
    ids=["deleted", "disabled"],
)
def test_a_delivery_whose_subscription_was_changed_by_hand_is_refused_at_its_send(events_kit, receiver, statement, reason):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url, "invoice.paid"), actor="a")
    publish_one(events_kit)
    with events_kit.engine.begin() as connection:
        connection.execute(text(statement), {"id": created.id})
    events_kit.drain()
    [row] = events_kit.deliveries()
    assert row["status"] == "stuck" and reason.format(id=created.id) in row["last_error"]
    assert receiver.requests == []
