"""NOTIFY on insert wakes the drain loops; the listener survives a lost connection."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.notify import channel_for, notify_statement
from tests.support.leadership import terminate_backend
from tests.support.models import SampleEvent

# The loops' safety-net poll is an hour away, so only a wake-up can deliver within the test.
SETTINGS = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=True)


@pytest.fixture
def kit(engine):
    kit = OutboxKit(engine, [SampleEvent], settings=SETTINGS)
    yield kit
    kit.close()


def enqueue(engine, receiver, n: int) -> None:
    with Session(engine) as session, session.begin():
        session.add(SampleEvent(target_url=receiver.url + "/events", payload={"n": n}))


def test_a_started_worker_drains_at_once_and_an_insert_wakes_it(engine, receiver, kit):
    enqueue(engine, receiver, 1)  # before anyone listens: its notification is lost
    kit.worker.start()
    receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)  # the loop claims on start
    assert kit.worker.listener.wait_for_generation(1, timeout=10)
    enqueue(engine, receiver, 2)
    receiver.wait_for(lambda r: len(r.requests) == 2, timeout=10)  # only the NOTIFY can wake it this soon
    assert [request.body for request in receiver.requests] == [{"n": 1}, {"n": 2}]


def test_listener_reconnects_after_its_backend_is_terminated_and_wakeups_resume(engine, database_url, receiver, kit):
    kit.worker.start()
    listener = kit.worker.listener
    assert listener.wait_for_generation(1, timeout=10)
    terminate_backend(database_url, listener.backend_pid)
    assert listener.wait_for_generation(2, timeout=10)
    enqueue(engine, receiver, 2)
    receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
    assert receiver.requests[0].body == {"n": 2}


def test_trigger_notifies_once_per_statement_and_enqueue_helper_notifies_on_commit(engine, database_url):
    channel = channel_for(SampleEvent)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        with engine.begin() as connection:
            connection.execute(SampleEvent.__table__.insert(), [{"target_url": "http://127.0.0.1:9/x"}] * 3)
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == [channel]
        assert list(listener.notifies(timeout=0.2)) == []  # one per statement, not one per row
        with engine.begin() as connection:
            connection.execute(notify_statement(SampleEvent))
            assert list(listener.notifies(timeout=0.2)) == []  # nothing before the commit
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == [channel]
