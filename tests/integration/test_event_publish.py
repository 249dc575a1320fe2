"""publish: one event row and, in one INSERT ... SELECT, one delivery per matching enabled subscription, in the
caller's transaction; the deliveries are drained as any outbox's rows, each signed with its subscription's secrets
and sent only where the URL guard lets it."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from outboxkit import EventDelivery, InvalidEventError, publish
from outboxkit.events import publish_with
from outboxkit.storage.tables import events
from tests.support.events import definition, events_kit, secret, verified  # noqa: F401  (fixture)
from tests.support.receiver import Reply


def test_one_event_reaches_every_matching_subscription_signed_with_its_own_secret(events_kit, receiver):
    store = events_kit.events.subscriptions
    exact = store.create(definition(receiver.url + "/exact", "invoice.paid", seed=1), actor="a")
    prefix = store.create(definition(receiver.url + "/prefix", "invoice.*", seed=2, headers={"X-Customer": "7"}), actor="a")
    store.create(definition(receiver.url + "/other", "customer.*", seed=3), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        published = publish(session, "invoice.paid", {"invoice": "in_1", "amount": 1200}, tenant=None)
    assert published.deliveries == 2
    events_kit.drain()
    by_path = {request.path: request for request in receiver.requests}
    assert sorted(by_path) == ["/exact", "/prefix"]
    assert verified(by_path["/exact"], secret(1)) and not verified(by_path["/exact"], secret(2))
    assert verified(by_path["/prefix"], secret(2)) and by_path["/prefix"].headers["X-Customer"] == "7"
    body = by_path["/exact"].body
    assert (body["type"], body["data"]) == ("invoice.paid", {"invoice": "in_1", "amount": 1200})
    assert body["timestamp"].endswith("Z")
    rows = events_kit.deliveries()
    assert {row["subscription_id"] for row in rows} == {exact.id, prefix.id}
    assert {row["status"] for row in rows} == {"done"} and {row["event_id"] for row in rows} == {published.event_id}


def test_a_rotation_signs_with_every_secret(events_kit, receiver):
    subscription = definition(receiver.url, "invoice.paid")
    rotated = type(subscription)(url=receiver.url, event_types=["invoice.paid"], secrets=[secret(5), secret(6)])
    events_kit.events.subscriptions.create(rotated, actor="a")
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.paid", {})
    events_kit.drain()
    [request] = receiver.requests
    assert verified(request, secret(5)) and verified(request, secret(6))
    assert len(request.headers["webhook-signature"].split()) == 2


def test_an_event_nobody_subscribed_to_is_recorded_with_no_delivery(events_kit):
    with Session(events_kit.engine) as session, session.begin():
        published = publish(session, "nobody.listens", {"a": 1})
    assert published.deliveries == 0
    assert events_kit.counts()["events"] == 1 and events_kit.deliveries() == []


def test_disabled_subscriptions_and_other_tenants_receive_nothing(events_kit, receiver):
    store = events_kit.events.subscriptions
    acme = store.create(definition(receiver.url + "/acme", "invoice.paid", tenant="acme"), actor="a")
    store.create(definition(receiver.url + "/globex", "invoice.paid", tenant="globex"), actor="a")
    store.create(definition(receiver.url + "/untenanted", "invoice.paid"), actor="a")
    off = store.create(definition(receiver.url + "/off", "invoice.paid", tenant="acme"), actor="a")
    store.disable(off.id, reason="paused by the customer", actor="a")
    with Session(events_kit.engine) as session, session.begin():
        published = publish(session, "invoice.paid", {}, tenant="acme")
    assert published.deliveries == 1
    assert [row["subscription_id"] for row in events_kit.deliveries()] == [acme.id]
    assert events_kit.deliveries()[0]["tenant"] == "acme"


def test_the_event_and_its_deliveries_roll_back_with_the_callers_transaction(events_kit, receiver):
    events_kit.events.subscriptions.create(definition(receiver.url, "invoice.paid"), actor="a")
    with Session(events_kit.engine) as session:
        with session.begin():
            publish(session, "invoice.paid", {})
            session.rollback()
    assert events_kit.counts()["events"] == 0 and events_kit.deliveries() == []


def test_a_subscription_made_after_an_event_does_not_receive_it(events_kit, receiver):
    store = events_kit.events.subscriptions
    store.create(definition(receiver.url + "/early", "invoice.paid"), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.paid", {"n": 1})
    store.create(definition(receiver.url + "/late", "invoice.paid"), actor="a")
    events_kit.drain()
    assert [request.path for request in receiver.requests] == ["/early"]


def test_a_subscription_created_while_a_publish_is_open_is_not_in_it(events_kit, receiver):
    store = events_kit.events.subscriptions
    with Session(events_kit.engine) as session, session.begin():
        session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        session.execute(text("SELECT 1"))  # the snapshot is taken
        store.create(definition(receiver.url, "invoice.paid"), actor="a")
        assert publish(session, "invoice.paid", {}).deliveries == 0


def test_the_core_variant_publishes_on_a_connection(events_kit, receiver):
    events_kit.events.subscriptions.create(definition(receiver.url, "invoice.*"), actor="a")
    with events_kit.engine.begin() as connection:
        assert publish_with(connection, "invoice.created", [1, 2]).deliveries == 1


def test_a_key_orders_each_subscriptions_deliveries_and_not_across_subscriptions(events_kit, receiver):
    store = events_kit.events.subscriptions
    first = store.create(definition(receiver.url + "/a", "invoice.*"), actor="a")
    second = store.create(definition(receiver.url + "/b", "invoice.*"), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.created", {"n": 1}, key="in_1")
        publish(session, "invoice.paid", {"n": 2}, key="in_1")
    keys = {(row["subscription_id"], row["ordering_key"]) for row in events_kit.deliveries()}
    assert keys == {(first.id, f"{first.id}:in_1"), (second.id, f"{second.id}:in_1")}
    events_kit.drain()
    for path in ("/a", "/b"):
        assert [request.body["data"]["n"] for request in receiver.requests if request.path == path] == [1, 2]


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [
        ({"event_type": "invoice paid"}, "event_type", "not an event type name"),
        ({"event_type": "invoice.*"}, "event_type", "not an event type name"),
        ({"key": ""}, "key", "1 to 200"),
        ({"tenant": 7}, "tenant", "1 to 200"),
        ({"payload": {"when": {1, 2}}}, "payload", "payload\\['when'\\]"),
        ({"payload": {"blob": "x" * 3_000_000}}, "payload", "bytes once encoded, over the bound of 262144"),
    ],
)
def test_bad_input_is_refused_in_the_callers_transaction_and_nothing_is_written(events_kit, receiver, arguments, field, message):
    events_kit.events.subscriptions.create(definition(receiver.url, "invoice.*"), actor="a")
    call = {"event_type": "invoice.paid", "payload": {}, **arguments}
    with Session(events_kit.engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match=message) as refused:
            publish(session, **call)
        assert refused.value.field == field
    assert events_kit.counts()["events"] == 0 and events_kit.deliveries() == []


def test_a_fan_out_over_the_bound_writes_nothing(events_kit, receiver):
    for number in range(6):
        events_kit.events.subscriptions.create(definition(receiver.url + f"/{number}", "invoice.paid"), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        with pytest.raises(InvalidEventError, match="matches more than 5 enabled subscriptions; nothing was written"):
            publish(session, "invoice.paid", {}, max_deliveries=5)
        assert publish(session, "invoice.paid", {}, max_deliveries=6).deliveries == 6
    assert events_kit.counts()["events"] == 1


def test_many_subscriptions_get_their_rows_from_one_statement(events_kit, receiver):
    with events_kit.engine.begin() as connection:  # 2,000 subscriptions written directly: the store checks each URL
        connection.execute(
            text(
                "INSERT INTO outboxkit_subscriptions (url, event_types, secrets, created_by, changed_by) "
                "SELECT :url || '/' || n, ARRAY['invoice.paid'], ARRAY[:secret], 'bench', 'bench' "
                "FROM generate_series(1, 2000) AS n"
            ),
            {"url": receiver.url, "secret": secret(1)},
        )
    with Session(events_kit.engine) as session, session.begin():
        assert publish(session, "invoice.paid", {"a": 1}).deliveries == 2000
    with events_kit.engine.connect() as connection:
        assert connection.scalar(select(events.c.id)) is not None
        assert connection.scalar(text("SELECT count(DISTINCT subscription_id) FROM outboxkit_event_deliveries")) == 2000


def test_a_refused_send_is_stuck_with_the_reason_and_nothing_is_sent(engine, clock, receiver):
    """With the allow-list off, an endpoint on 127.0.0.1 saved earlier (or written by hand) is refused at its send."""
    from outboxkit import OutboxKit, OutboxKitSettings

    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outboxkit_subscriptions (url, event_types, secrets, created_by, changed_by) "
                "VALUES (:url, ARRAY['invoice.paid'], ARRAY[:secret], 'sql', 'sql')"
            ),
            {"url": receiver.url, "secret": secret(1)},
        )
    with OutboxKit(engine, [EventDelivery], clock=clock, settings=OutboxKitSettings(listen_enabled=False)) as kit:
        with Session(engine) as session, session.begin():
            assert publish(session, "invoice.paid", {}).deliveries == 1
        kit.drainer(EventDelivery).drain()
    with engine.connect() as connection:
        row = connection.execute(select(EventDelivery.__table__)).mappings().one()
    assert row["status"] == "stuck" and "loopback" in row["last_error"] and "OUTBOXKIT_URL_ALLOW_LIST" in row["last_error"]
    assert receiver.requests == []


def test_a_receiver_that_fails_is_retried_like_any_outbox_row(events_kit, receiver):
    events_kit.events.subscriptions.create(definition(receiver.url, "invoice.paid"), actor="a")
    receiver.respond = lambda request: Reply(status=503)
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.paid", {})
    events_kit.drain()
    [row] = events_kit.deliveries()
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, 503)
