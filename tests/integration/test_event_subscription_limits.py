"""A subscription's own rate limit and cap on sends in flight: they are its destination's limits
(``outboxkit_destination_limits``, the row an operator's limits live in), written with the subscription, moved with
its URL, read back with it, and obeyed by a running drain while another subscription on the same host flows.

Real database, real receivers on 127.0.0.1.  Nothing sleeps: each step waits for what the receiver got or what
the database holds; what must not happen is shown by a later claim that provably walked the limited destination
(a row of the other subscription it delivered).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import EventDelivery, OutboxKit, OutboxKitSettings, publish
from outboxkit.errors import InvalidSubscriptionError
from outboxkit.events.store import subscription_destination
from outboxkit.operations.destination_limits import DestinationLimitOperations
from tests.support.events import definition, events_kit  # noqa: F401  (fixture)
from tests.support.leadership import wait_until
from tests.support.receiver import Receiver, Reply
from tests.support.schedules import LOOPBACK_ALLOWED


@pytest.fixture
def other_receiver():
    with Receiver() as receiver:
        yield receiver


def limit_rows(engine) -> dict[str, tuple[Any, Any]]:
    """The deliveries outbox's destination limits: destination -> (per second, cap)."""
    with engine.connect() as connection:
        return {row.destination: (row.per_second, row.cap) for row in connection.execute(text(
            "SELECT destination, per_second, cap FROM outboxkit_destination_limits WHERE outbox = 'event-deliveries'"))}


def audit(engine) -> list[tuple[str, dict | None, dict | None]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT action, before, after FROM outboxkit_subscription_audit ORDER BY id"))]


def limits_of(snapshot: dict | None) -> tuple[Any, Any] | None:
    return None if snapshot is None else (snapshot["rate_limit"], snapshot["max_in_flight"])


def test_a_subscriptions_limits_are_its_destinations_row_written_read_and_audited_with_it(events_kit, receiver):
    store = events_kit.events.subscriptions
    limited = store.create(definition(receiver.url + "/a", "invoice.paid", rate_limit=2.5, max_in_flight=3), actor="a")
    plain = store.create(definition(receiver.url + "/b", "invoice.paid"), actor="a")
    destination = subscription_destination(limited.id, limited.url)
    assert limit_rows(events_kit.engine) == {destination: (2.5, 3)}
    assert (limited.rate_limit, limited.max_in_flight) == (2.5, 3)
    assert (plain.rate_limit, plain.max_in_flight) == (None, None)
    assert (store.get(limited.id).rate_limit, store.get(limited.id).max_in_flight) == (2.5, 3)
    assert {found.id: (found.rate_limit, found.max_in_flight) for found in store.list()} == {
        limited.id: (2.5, 3), plain.id: (None, None)}
    assert [(action, limits_of(before), limits_of(after)) for action, before, after in audit(events_kit.engine)] == [
        ("create", None, (2.5, 3)), ("create", None, (None, None))]

    # One source of truth: an operator's change of that destination's limits is the subscription's.
    operations = DestinationLimitOperations(events_kit.kit)
    operations.set("event-deliveries", destination, per_second=None, cap=1, actor="operator")
    assert (store.get(limited.id).rate_limit, store.get(limited.id).max_in_flight) == (None, 1)

    # An edit sets them as given: changed, then left out (the outbox's own again: the row goes).
    store.edit(limited.id, definition(receiver.url + "/a", "invoice.paid", rate_limit=10, max_in_flight=1), actor="b")
    assert limit_rows(events_kit.engine) == {destination: (10.0, 1)}
    cleared = store.edit(limited.id, definition(receiver.url + "/a", "invoice.paid"), actor="b")
    assert (cleared.rate_limit, cleared.max_in_flight) == (None, None)
    assert limit_rows(events_kit.engine) == {}
    assert [(limits_of(before), limits_of(after)) for action, before, after in audit(events_kit.engine)[2:]] == [
        ((None, 1), (10.0, 1)), ((10.0, 1), (None, None))]


def test_a_url_change_moves_the_limits_to_the_new_destination_with_the_pending_deliveries(events_kit, receiver, other_receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url + "/in", "invoice.paid", rate_limit=4, max_in_flight=2), actor="a")
    with Session(events_kit.engine) as session, session.begin():
        publish(session, "invoice.paid", {"n": 1})
    old = subscription_destination(created.id, created.url)
    assert limit_rows(events_kit.engine) == {old: (4.0, 2)}

    moved = store.edit(
        created.id, definition(other_receiver.url + "/in", "invoice.paid", rate_limit=4, max_in_flight=2), actor="b"
    )
    new = subscription_destination(created.id, moved.url)
    assert new != old
    assert limit_rows(events_kit.engine) == {new: (4.0, 2)}  # the old key's row is gone
    assert {row["destination"] for row in events_kit.deliveries()} == {new}
    assert (moved.rate_limit, moved.max_in_flight) == (4.0, 2)

    # Moved and changed at once.
    again = store.edit(created.id, definition(receiver.url + "/in", "invoice.paid", max_in_flight=5), actor="b")
    assert limit_rows(events_kit.engine) == {old: (None, 5)}
    assert (again.rate_limit, again.max_in_flight) == (None, 5)


def test_disable_and_enable_keep_the_limits_and_delete_removes_them(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url + "/in", "invoice.paid", max_in_flight=1), actor="a")
    destination = subscription_destination(created.id, created.url)
    disabled = store.disable(created.id, reason="maintenance", actor="a")
    assert disabled.max_in_flight == 1 and limit_rows(events_kit.engine) == {destination: (None, 1)}
    enabled = store.enable(created.id, actor="a")
    assert enabled.max_in_flight == 1 and limit_rows(events_kit.engine) == {destination: (None, 1)}
    store.delete(created.id, actor="a")
    assert limit_rows(events_kit.engine) == {}
    assert limits_of(audit(events_kit.engine)[-1][1]) == (None, 1)  # the delete's entry keeps what it had


def test_a_bad_limit_is_refused_and_changes_nothing(events_kit, receiver):
    store = events_kit.events.subscriptions
    created = store.create(definition(receiver.url + "/in", "invoice.paid", max_in_flight=2), actor="a")
    before = (events_kit.counts(), limit_rows(events_kit.engine))
    with pytest.raises(InvalidSubscriptionError) as refused:
        store.edit(created.id, definition(receiver.url + "/in", "invoice.paid", max_in_flight=0), actor="b")
    assert refused.value.field == "max_in_flight"
    assert (events_kit.counts(), limit_rows(events_kit.engine)) == before


# Only a wake-up (an insert's NOTIFY) makes the loop claim within the test: its safety net is an hour away.
WORKER_SETTINGS = OutboxKitSettings(
    drain_interval_seconds=3600, listen_enabled=True, url_allow_list=LOOPBACK_ALLOWED,
    outboxes={"event_deliveries": {"timeout": 60, "concurrency": 16}},
)


def publish_one(engine, number: int) -> None:
    with Session(engine) as session, session.begin():
        publish(session, "invoice.paid", {"n": number})


def test_a_running_drain_keeps_one_send_of_a_capped_subscription_in_flight_while_its_host_neighbour_flows(
    engine, receiver
):
    receiver.respond = lambda request: Reply(hang=True) if request.path == "/capped" else Reply()
    with OutboxKit(engine, [EventDelivery], settings=WORKER_SETTINGS) as kit:
        store = kit.events.subscriptions
        capped = store.create(
            definition(receiver.url + "/capped", "invoice.paid", rate_limit=1000, max_in_flight=1), actor="a"
        )
        store.create(definition(receiver.url + "/flowing", "invoice.paid"), actor="a")
        capped_destination = subscription_destination(capped.id, capped.url)
        kit.worker.start()

        def arrived(path: str) -> int:
            return sum(request.path == path for request in receiver.requests)

        publish_one(engine, 1)
        receiver.wait_for(lambda r: r.in_flight_by_path["/capped"] == 1 and arrived("/flowing") == 1)
        for number in (2, 3, 4):
            publish_one(engine, number)
            # The claim that takes the neighbour's row walks the capped one's due row and leaves it.
            receiver.wait_for(lambda r, number=number: arrived("/flowing") == number)
        assert arrived("/capped") == 1
        with engine.connect() as connection:
            waiting = connection.execute(text(
                "SELECT attempts FROM outboxkit_event_deliveries WHERE destination = :destination "
                "AND status = 'pending' AND claim_token IS NULL ORDER BY id"), {"destination": capped_destination}).all()
        assert [row.attempts for row in waiting] == [0, 0, 0]  # held back unclaimed: no attempt spent

        receiver.release()  # each answer frees the one slot for the next
        receiver.wait_for(lambda r: arrived("/capped") == 4)
        wait_until(lambda: {row["status"] for row in _deliveries(engine)} == {"done"}, message="every delivery done")
        assert receiver.max_in_flight_by_path["/capped"] == 1


def _deliveries(engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(text("SELECT status FROM outboxkit_event_deliveries")).mappings())
