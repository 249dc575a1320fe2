"""NOTIFY on insert wakes the drain loops; the listener survives a lost connection."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.storage.notify import channel_for, notify_statement
from outboxkit.transports import http as http_transport
from tests.support.leadership import terminate_backend, wait_until
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


def change_pause(engine, kit, *, paused: bool) -> None:
    """Pause or resume SampleEvent's drains as the admin does, in one committed transaction."""
    from outboxkit.storage.pauses import pause, resume

    job_name = SampleEvent.__outbox__.job_name
    with engine.begin() as connection:
        if paused:
            assert pause(connection, job_name, actor="test", now=kit.clock.now())
        else:
            assert resume(connection, job_name)


def test_a_listening_drainer_hears_a_pause_and_a_resume_at_once(engine, receiver, kit):
    kit.worker.start()
    assert kit.worker.listener.wait_for_generation(1, timeout=10)
    check = kit.drainer(SampleEvent).pause_check
    check.trust_seconds = 3600.0  # only a notification can change the answer within the test
    wait_until(lambda: check.following, message="the pause check follows the listener")
    assert check.paused() is False

    change_pause(engine, kit, paused=True)
    wait_until(check.paused, message="the pause reaches the listening drainer")
    change_pause(engine, kit, paused=False)  # the resume notifies the pause channel only: it must wake the loop too
    wait_until(lambda: not check.paused(), message="the resume reaches the listening drainer")
    enqueue(engine, receiver, 3)
    receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)


def test_a_resume_wakes_a_listening_drainer_to_claim_the_rows_that_waited(engine, receiver, kit):
    change_pause(engine, kit, paused=True)
    kit.worker.start()
    assert kit.worker.listener.wait_for_generation(1, timeout=10)
    check = kit.drainer(SampleEvent).pause_check
    wait_until(lambda: check.following and check.paused(), message="the drainer knows it is paused")
    enqueue(engine, receiver, 4)  # its wake-up claims nothing: paused
    change_pause(engine, kit, paused=False)  # no insert, no NOTIFY on the outbox's channel: the pause channel alone
    receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
    assert receiver.requests[0].body == {"n": 4}


def test_an_inserts_wake_up_does_not_read_the_pause_again_while_the_listener_is_connected(engine, receiver, kit):
    drainer = kit.drainer(SampleEvent)
    reads: list[bool] = []
    read = drainer.pause_check._read

    def counted() -> bool:
        reads.append(read())
        return reads[-1]

    drainer.pause_check._read = counted
    kit.worker.start()
    assert kit.worker.listener.wait_for_generation(1, timeout=10)
    wait_until(lambda: drainer.pause_check.following, message="the pause check follows the listener")
    enqueue(engine, receiver, 0)
    receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
    before = len(reads)
    for n in range(1, 6):
        enqueue(engine, receiver, n)
        receiver.wait_for(lambda r, sent=n + 1: len(r.requests) == sent, timeout=10)
    # Five wake-ups, five claims: at most one read, the one a wake-up of the listener's connection may still owe.
    assert len(reads) - before <= 1 and not any(reads)


def test_rows_enqueued_one_at_a_time_go_out_on_one_send_thread_and_one_kept_alive_connection(
    engine, receiver, kit, monkeypatch
):
    # Each send thread keeps its own connections: the thread that went idle last takes the next row, so
    # an idle drainer does not open a connection per thread (docs/performance.md, idle latency).
    monkeypatch.setattr(http_transport, "KEEPALIVE_EXPIRY_SECONDS", 3600.0)  # a slow host's pauses expire nothing
    senders = kit.drainer(SampleEvent).pump.senders
    kit.worker.start()
    assert kit.worker.listener.wait_for_generation(1, timeout=10)
    for n in range(8):
        enqueue(engine, receiver, n)
        receiver.wait_for(lambda r, sent=n + 1: len(r.requests) == sent, timeout=10)
        wait_until(lambda: senders.idle == senders.threads, message="the send thread went back idle")
    assert [request.body for request in receiver.requests] == [{"n": n} for n in range(8)]
    assert senders.threads == 1
    assert receiver.connections == 1
