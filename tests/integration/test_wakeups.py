"""Pending wake-ups: an insert notifies only when none is pending, and the drain still wakes for every commit."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.storage.notify import channel_for
from outboxkit.storage.wakeups import Wakeups
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent

# The loops' safety-net poll is an hour away: only wake-ups (and the loop's own re-checks) deliver in time.
SETTINGS = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=True)


def add_row(engine, receiver, n: object) -> None:
    with Session(engine) as session, session.begin():
        session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": n}))


def done_rows(engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM sample_event_outbox WHERE status = 'done'")).scalar_one())


def test_inserts_notify_once_while_a_wake_up_is_pending_and_again_once_the_drain_cleared_it(
    engine, database_url, receiver
):
    channel = channel_for(SampleEvent)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        for n in range(5):  # five transactions, nobody drains: one wake-up is pending after the first
            add_row(engine, receiver, n)
        assert [notification.channel for notification in listener.notifies(timeout=5, stop_after=1)] == [channel]
        assert list(listener.notifies(timeout=0.3)) == []
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            assert Wakeups(channel).clear(connection) is True
        add_row(engine, receiver, "after the clear")
        assert [notification.channel for notification in listener.notifies(timeout=5, stop_after=1)] == [channel]


def test_the_clear_fails_while_an_insert_that_did_not_notify_is_still_open(engine, receiver):
    channel = channel_for(SampleEvent)
    add_row(engine, receiver, "pending")  # a wake-up is pending now
    with Session(engine) as open_session:
        open_session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": "open"}))
        open_session.flush()  # inserted, relying on the pending wake-up, not committed
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            assert Wakeups(channel).clear(connection) is False
            open_session.commit()
            assert Wakeups(channel).clear(connection) is True
            assert connection.execute(text("SELECT count(*) FROM outboxkit_wakeups")).scalar_one() == 0


@pytest.fixture
def kit(engine):
    kit = OutboxKit(engine, [SampleEvent], settings=SETTINGS)
    yield kit
    kit.close()


def test_the_drain_wakes_for_every_committed_transaction_one_after_another(engine, receiver, kit):
    kit.worker.start()
    listener = kit.worker.listener
    assert listener is not None and listener.wait_for_generation(1, timeout=10)
    for n in range(20):  # each commit must wake the loop: its poll is an hour away
        add_row(engine, receiver, n)
        receiver.wait_for(lambda r, count=n + 1: len(r.requests) == count, timeout=30)
    assert [request.body for request in receiver.requests] == [{"n": n} for n in range(20)]


def test_the_drain_wakes_for_every_committed_transaction_of_concurrent_producers(engine, receiver, kit):
    kit.worker.start()
    listener = kit.worker.listener
    assert listener is not None and listener.wait_for_generation(1, timeout=10)
    producers, per_producer = 8, 25
    release = threading.Event()

    def produce(producer: int) -> None:
        for n in range(per_producer):
            with Session(engine) as session, session.begin():
                session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": f"{producer}-{n}"}))
                if producer == 0 and n == per_producer - 1:
                    session.flush()
                    release.wait(10)  # the last row's transaction stays open while the others commit

    threads = [threading.Thread(target=produce, args=(producer,)) for producer in range(producers)]
    for thread in threads:
        thread.start()
    receiver.wait_for(lambda r: len(r.requests) == producers * per_producer - 1, timeout=60)
    release.set()  # it commits now, maybe without notifying: the loop must claim it all the same
    for thread in threads:
        thread.join(30)
    receiver.wait_for(lambda r: len(r.requests) == producers * per_producer, timeout=60)
    assert sorted(str(request.body["n"]) for request in receiver.requests) == sorted(
        f"{producer}-{n}" for producer in range(producers) for n in range(per_producer)
    )


def test_a_row_whose_insert_relied_on_a_pending_wake_up_is_claimed_once_its_transaction_commits(engine, receiver):
    # No listener: neither a NOTIFY nor the listener's wake-up on connecting can deliver row 2 in time.
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False))
    try:
        add_row(engine, receiver, 1)  # a wake-up is pending now
        with Session(engine) as open_session:
            open_session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": 2}))
            open_session.flush()  # relies on the pending wake-up: it will not notify
            kit.worker.start()  # the loop claims row 1 but cannot clear the wake-up while this transaction is open
            receiver.wait_for(lambda r: len(r.requests) == 1, timeout=30)
            wait_until(lambda: done_rows(engine) == 1, timeout=30)  # row 1 recorded: no lease of its left to wake on
            open_session.commit()
        receiver.wait_for(lambda r: len(r.requests) == 2, timeout=30)  # the poll is an hour away
        assert [request.body for request in receiver.requests] == [{"n": 1}, {"n": 2}]
    finally:
        kit.close()
