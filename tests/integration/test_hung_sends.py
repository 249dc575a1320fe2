"""Hung sends in a real drain: past their threshold they stop counting against concurrency, within the bound.

Real database, a real receiver that holds its answers until the test releases
them (``Receiver``), and a real blackhole (``Blackhole``: accepts TCP
connections, never answers).  Every assertion is on counts (requests out at
once at the receiver, connections open at the blackhole, send threads, sends
hung), never on how long something took.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
from sqlalchemy import text

from outboxkit import Drainer, HttpTransport
from outboxkit.breaker import BreakerOptions
from tests.integration.test_destination_drain import Blackhole, insert_at
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.receiver import Reply

BREAKER = BreakerOptions(failures=3, cool_down=60, max_cool_down=240)


def options(**overrides: object):
    return dataclasses.replace(
        SampleEvent.__outbox__, timeout=30, breaker=BREAKER, hung_send_seconds=0.1, **overrides  # type: ignore[arg-type]
    )


def test_hung_sends_to_a_blackhole_leave_the_healthy_destination_every_send_thread(engine, receiver, read_events):
    """Concurrency 4: the blackhole's two sends hang; once hung they no longer count, so the healthy receiver gets
    four requests out at once (it could get at most two while they counted), and the blackhole still holds two."""
    receiver.respond = lambda request: Reply(hang=True)  # the healthy receiver's answers wait for the test
    drainer_options = options(concurrency=4, batch_size=8, destination_concurrency=4)
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=drainer_options)
        try:
            with Blackhole() as blackhole:
                dead = insert_at(engine, blackhole.url, [{"n": n} for n in range(2)])  # claimed first
                healthy = insert_at(engine, receiver.url, [{"n": n} for n in range(12)])
                drainer.start(poll_seconds=1)
                receiver.wait_for(lambda r: r.in_flight == 4, timeout=25)  # all of concurrency, well inside 30 s
                assert blackhole.open_now == 2  # its sends are still out: they hang, they were not replaced
                assert drainer.pump.hung.by_destination().get(blackhole.url, 0) == 2
                assert drainer.pump.senders.threads <= 4 + 16  # at most concurrency + four times it
                receiver.respond = lambda request: Reply()
                receiver.release()
                wait_until(
                    lambda: sum(row.status == "done" for row in read_events().values()) == len(healthy),
                    timeout=25, message="every healthy row delivered",
                )
                drainer.stop(wait=False)
                sent_to_blackhole = blackhole.accepted
        finally:
            drainer.close()  # the blackhole closed its connections: the hanging sends have ended and are recorded
    rows = read_events()
    assert all(rows[row_id].status == "done" for row_id in healthy)
    counts = receiver.count_by_key()
    assert all(rows[row_id].attempts == counts[str(rows[row_id].idempotency_key)] for row_id in healthy)
    # The blackhole's rows: each attempt is one connection it accepted, none spent while held, none lost.
    assert sum(rows[row_id].attempts for row_id in dead) == sent_to_blackhole == 2
    assert all(rows[row_id].status == "pending" and rows[row_id].last_error for row_id in dead)
    assert drainer.pump.hung.count == 0 and drainer.in_flight == 0


@pytest.mark.parametrize(("limit", "hung"), [(None, 8), (3, 3)], ids=["default", "set"])
def test_no_more_sends_hang_than_the_limit_so_at_most_concurrency_plus_it_threads_run(
    engine, read_events, limit: int | None, hung: int
) -> None:
    """A lone blackhole (uncapped: nobody to protect) with more rows than can hang: concurrency 2, batch 4.  Sends
    hang and others start beside them on extra threads until ``hung_send_limit`` sends are hung (by default four
    times concurrency); there it stops: two more are out and count, so concurrency plus the limit threads run."""
    drainer_options = options(concurrency=2, batch_size=4, hung_send_limit=limit)
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=drainer_options)
        try:
            with Blackhole() as blackhole:
                ids = insert_at(engine, blackhole.url, [{"n": n} for n in range(hung + 6)])
                drainer.start(poll_seconds=1)
                wait_until(lambda: blackhole.open_now == hung + 2 and drainer.pump.hung.count == hung, timeout=25,
                           message=f"{hung + 2} sends out, {hung} of them hung")
                assert drainer.pump.senders.threads == hung + 2  # concurrency + the limit, never more
                assert blackhole.accepted == hung + 2
                drainer.stop(wait=False)
        finally:
            drainer.close()
    rows = read_events()
    assert len(rows) == len(ids) and all(row.status == "pending" for row in rows.values())  # nothing lost


def test_more_dead_destinations_than_send_threads_leave_the_healthy_one_flowing(engine, receiver, read_events):
    """Six destinations that never answer, one row each, against two send threads: each of their sends hangs, and
    the healthy destination's rows are all delivered while the six are still out."""
    drainer_options = options(concurrency=2, batch_size=4)
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=drainer_options)
        try:
            with Blackhole() as blackhole:
                dead = insert_at(engine, blackhole.url, [{"n": n} for n in range(6)])  # claimed first
                with engine.begin() as connection:  # six destinations, as Outbox.destination_for could name them
                    connection.execute(
                        text("UPDATE sample_event_outbox SET destination = 'dead-' || id WHERE id = ANY(:ids)"),
                        {"ids": dead},
                    )
                healthy = insert_at(engine, receiver.url, [{"n": n} for n in range(10)])
                drainer.start(poll_seconds=1)
                wait_until(
                    lambda: sum(row.status == "done" for row in read_events().values()) == len(healthy),
                    timeout=25, message="every healthy row delivered, well inside the dead sends' 30 s",
                )
                assert blackhole.open_now == 6  # the dead sends are all still out
                drainer.stop(wait=False)
        finally:
            drainer.close()
    rows = read_events()
    assert all(rows[row_id].status == "pending" for row_id in dead)  # nothing lost


def test_close_waits_for_hung_sends_and_records_their_outcomes(engine, receiver, read_events):
    """Hung sends are sends like any other at shutdown: close() waits for them and their outcomes are written."""
    receiver.respond = lambda request: Reply(hang=True)
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=options(concurrency=2, batch_size=4))
        ids = insert_at(engine, receiver.url, [{"n": n} for n in range(2)])
        drainer.start(poll_seconds=1)
        wait_until(lambda: drainer.pump.hung.count == 2, timeout=25, message="both sends hung")
        assert drainer.in_flight == 2  # a hung send gave its place back, not its row
        closing = threading.Thread(target=drainer.close)
        closing.start()  # it cannot return before the receiver answers
        assert closing.is_alive() and receiver.in_flight == 2
        receiver.respond = lambda request: Reply()
        receiver.release()
        closing.join(timeout=25)
        assert not closing.is_alive()
    rows = read_events()
    assert [(rows[row_id].status, rows[row_id].attempts) for row_id in ids] == [("done", 1)] * 2
    assert drainer.pump.hung.count == 0
