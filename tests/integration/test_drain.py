"""The drain's invariants (DESIGN.md section 3), in one process, against real PostgreSQL and a real receiver.

Each test names the invariant it pins and would fail if the drain broke it.
Time moves only through the injected ``ManualClock``.  Worker-process
variants (two processes, kill -9, a poison row) are in test_drain_processes.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text

from tests.support.database import sqlalchemy_url
from tests.support.drain_worker import FAST_COMMITS
from tests.support.receiver import Reply


def run_in_thread(function):
    """Start ``function`` in a thread; return (thread, box) where box["result"] is its return value."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", function()), daemon=True)
    thread.start()
    return thread, box


def await_condition(predicate, timeout: float = 30.0, message: str = "condition") -> None:
    """Poll ``predicate`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message}: not met within {timeout}s")
        time.sleep(0.02)  # a poll interval, not a wait for time to pass


def test_claim_takes_the_oldest_due_rows_first(insert_events, read_events, make_drainer, receiver, clock):
    now = clock.now()
    # Inserted newest first, so id order and due order disagree.
    ids = [insert_events([{"n": n}], next_attempt_at=now - timedelta(minutes=n))[0] for n in range(6)]
    ids_oldest_first = list(reversed(ids))

    result = make_drainer(batch_size=3).drain_once()

    assert result.claimed == 3 and result.delivered == 3
    rows = read_events()
    assert [row_id for row_id in ids_oldest_first if rows[row_id].status == "done"] == ids_oldest_first[:3]
    assert sorted(request.body["n"] for request in receiver.requests) == [3, 4, 5]


def test_a_row_locked_by_another_transaction_is_skipped_not_waited_for(
    database_url, engine, insert_events, read_events, make_drainer, receiver
):
    ids = insert_events([{"n": n} for n in range(5)])
    locked_id = ids[0]  # the oldest: first in line for the claim
    # If the claim waited for the lock, it would fail after lock_timeout instead of hanging the test.
    impatient = create_engine(
        sqlalchemy_url(database_url), pool_size=2, max_overflow=0, connect_args={"options": "-c lock_timeout=5000"}
    )
    try:
        with engine.connect() as blocker:
            blocker.execute(text("SELECT id FROM sample_event_outbox WHERE id = :id FOR UPDATE"), {"id": locked_id})
            result = make_drainer(impatient).drain_once()
            assert result.error is None
            assert result.claimed == 4 and result.delivered == 4
            rows = read_events()
            assert rows[locked_id].status == "pending" and rows[locked_id].attempts == 0
            assert str(rows[locked_id].idempotency_key) not in receiver.keys()
            blocker.rollback()
        result = make_drainer(impatient).drain_once()
        assert result.claimed == 1 and read_events()[locked_id].status == "done"
    finally:
        impatient.dispose()


def test_a_row_orphaned_by_a_dead_worker_is_claimed_alone(engine, insert_events, read_events, make_drainer, receiver):
    ids = insert_events([{"n": n} for n in range(6)])
    orphans = ids[1:4]  # as a worker that died mid-batch leaves them: claimed, attempt counted, no outcome
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sample_event_outbox SET claim_token = gen_random_uuid(), attempts = 1 WHERE id = ANY(:ids)"),
            {"ids": orphans},
        )
    drainer = make_drainer()

    first = drainer.drain_once()

    assert first.claimed == 1 and first.delivered == 1
    assert [row_id for row_id, row in read_events().items() if row.status == "done"] == [orphans[0]]
    assert drainer.drain().delivered == 5, "drain goes on past the short batches of orphans"
    assert {row.status for row in read_events().values()} == {"done"}


# -- disjoint claims ----------------------------------------------------------------


def test_two_drains_in_two_threads_deliver_every_row_exactly_once(
    database_url, insert_events, read_events, make_drainer, receiver
):
    insert_events([{"n": n} for n in range(2000)])
    # Commits need not wait for the disk here (visibility is unchanged): the test is about who gets which row.
    fast = create_engine(
        sqlalchemy_url(database_url), pool_size=4, max_overflow=0, connect_args={"options": FAST_COMMITS}
    )
    # Small batches mean many claims, so the two drains' claims often run at the same moment.
    drainers = [make_drainer(fast, batch_size=10), make_drainer(fast, batch_size=10)]
    start = threading.Barrier(2)

    def drain_all(drainer):
        start.wait()
        return drainer.drain()

    threads = [run_in_thread(lambda drainer=drainer: drain_all(drainer)) for drainer in drainers]
    try:
        for thread, _ in threads:
            thread.join(timeout=120)
    finally:
        for drainer in drainers:
            drainer.close()
        fast.dispose()
    results = [box["result"] for _, box in threads]

    assert all(result.error is None and not result.errors for result in results)
    assert all(result.claimed > 0 for result in results), "both drains must have taken part"
    assert sum(result.delivered for result in results) == 2000
    counts = receiver.count_by_key()
    rows = read_events()
    assert set(counts) == {str(row.idempotency_key) for row in rows.values()}
    assert set(counts.values()) == {1}, "a row was delivered twice"
    assert {row.status for row in rows.values()} == {"done"}
    assert {row.attempts for row in rows.values()} == {1}


# -- one row's failure is its own --------------------------------------------------


def test_a_build_delivery_error_counts_one_failed_attempt_and_the_batch_goes_on(
    engine, insert_events, read_events, make_drainer, receiver, clock, caplog
):
    ids = insert_events([{"n": 0}, {"n": 1}, {"raise": True}, {"n": 3}, {"n": 4}, {"n": 5}])
    broken_id, rejected_id, unavailable_id = ids[2], ids[4], ids[5]
    answers = {4: Reply(status=400, body=b"no such account"), 5: Reply(status=503)}
    receiver.respond = lambda request: answers.get(request.body["n"], Reply())
    drainer = make_drainer()

    result = drainer.drain_once()

    assert (result.claimed, result.delivered, result.retried, result.stuck) == (6, 3, 2, 1)
    assert result.error is None
    assert engine.pool.checkedout() == 0
    rows = read_events()
    broken = rows[broken_id]
    assert broken.status == "pending" and broken.attempts == 1
    assert "ValueError" in broken.last_error and f"cannot build row {broken_id}: bad payload" in broken.last_error
    assert broken.next_attempt_at == clock.now() + timedelta(seconds=1)  # backoff[0]
    logged = [record for record in caplog.records if record.name.startswith("outboxkit.drain.") and record.levelname == "ERROR"]
    assert any("Traceback" in record.getMessage() and "bad payload" in record.getMessage() for record in logged)
    # Each neighbour's outcome is its own, written in the same batch.
    assert [rows[row_id].status for row_id in (ids[0], ids[1], ids[3])] == ["done"] * 3
    assert (rows[rejected_id].status, rows[rejected_id].last_status_code) == ("stuck", 400)
    assert (rows[unavailable_id].status, rows[unavailable_id].last_status_code) == ("pending", 503)
    assert len(receiver.requests) == 5

    assert drainer.drain_once().claimed == 0  # nothing is due before its backoff
    clock.advance(seconds=1)
    assert drainer.drain_once().claimed == 2  # the broken row and the 503, again
    broken = read_events()[broken_id]
    assert broken.attempts == 2 and broken.next_attempt_at == clock.now() + timedelta(seconds=2)


# -- bounded sends, no transaction across them ---------------------------------------


def test_concurrency_bounds_the_requests_in_flight(insert_events, read_events, make_drainer, receiver):
    insert_events([{"n": n} for n in range(24)])
    receiver.respond = lambda request: Reply(delay=0.05)  # long enough for sends to overlap

    result = make_drainer(concurrency=4).drain_once()

    assert result.delivered == 24
    assert 1 < receiver.max_in_flight <= 4


def test_a_hung_receiver_costs_one_slot_and_the_row_retries_with_a_timeout(
    insert_events, read_events, make_drainer, receiver, clock
):
    ids = insert_events([{"n": n} for n in range(12)])
    hung_id = ids[0]  # first round of sends
    receiver.respond = lambda request: Reply(hang=True) if request.body["n"] == 0 else Reply()
    # The hung send ends at its deadline; the eleven others need a fraction of it, even on a loaded host.
    drainer = make_drainer(concurrency=3, timeout=3.0)
    thread, box = run_in_thread(drainer.drain_once)
    try:
        others = [row_id for row_id in ids if row_id != hung_id]
        # The other eleven rows are delivered and recorded while the hung one still holds its slot.
        await_condition(
            lambda: all(read_events()[row_id].status == "done" for row_id in others), message="neighbours done"
        )
        assert receiver.in_flight == 1 and thread.is_alive()
        thread.join(timeout=30)
    finally:
        receiver.release()
    result = box["result"]
    assert result.delivered == 11 and result.retried == 1
    hung = read_events()[hung_id]
    assert hung.status == "pending" and hung.attempts == 1
    assert hung.last_error.startswith("timeout")
    assert hung.next_attempt_at == clock.now() + timedelta(seconds=1)
    clock.advance(seconds=1)
    assert drainer.drain_once().delivered == 1  # the retry, now answered
    assert receiver.count_by_key()[str(hung.idempotency_key)] == 2


def test_no_transaction_is_open_while_deliveries_are_in_flight(
    database_url, engine, insert_events, read_events, make_drainer, receiver
):
    application = "outboxkit-drain-under-test"
    drainer_engine = create_engine(
        sqlalchemy_url(database_url), pool_size=5, max_overflow=0, connect_args={"application_name": application}
    )
    insert_events([{"n": n} for n in range(8)])
    # Half answer at once (their outcomes get written), half stall.
    receiver.respond = lambda request: Reply(hang=True) if request.body["n"] % 2 else Reply()
    drainer = make_drainer(drainer_engine, concurrency=8)
    thread, box = run_in_thread(drainer.drain_once)
    try:
        receiver.wait_for(lambda r: len(r.requests) == 8)
        await_condition(lambda: sum(row.status == "done" for row in read_events().values()) == 4, message="4 done")
        with engine.connect() as connection:
            backends = connection.execute(
                text(
                    "SELECT pid, state, xact_start FROM pg_stat_activity "
                    "WHERE application_name = :name AND datname = current_database()"
                ),
                {"name": application},
            ).all()
        assert backends, "the drainer's connections should be visible"
        assert [backend for backend in backends if backend.xact_start is not None or backend.state != "idle"] == []
    finally:
        receiver.release()
        thread.join(timeout=30)
        drainer.close()
        drainer_engine.dispose()
    assert box["result"].delivered == 8


# -- outcomes guarded by the claim token ---------------------------------------------


def test_a_row_reset_during_its_delivery_keeps_the_reset(
    engine, insert_events, read_events, make_drainer, receiver, clock
):
    reset_id, neighbour_id = insert_events([{"n": 0}, {"n": 1}])
    receiver.respond = lambda request: Reply(hang=True) if request.body["n"] == 0 else Reply()
    thread, box = run_in_thread(make_drainer().drain_once)
    try:
        receiver.wait_for(lambda r: len(r.requests) == 2)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE sample_event_outbox SET status = 'pending', attempts = 0, claim_token = NULL, "
                    "claimed_until = NULL, next_attempt_at = :now, last_error = 'reset by an operator' WHERE id = :id"
                ),
                {"id": reset_id, "now": clock.now()},
            )
    finally:
        receiver.release()
        thread.join(timeout=30)
    result = box["result"]
    assert result.lost_claims == 1 and result.delivered == 1
    rows = read_events()
    reset = rows[reset_id]
    assert (reset.status, reset.attempts, reset.delivered_at, reset.claim_token) == ("pending", 0, None, None)
    assert reset.last_error == "reset by an operator"
    assert rows[neighbour_id].status == "done"


def test_an_outcome_after_the_lease_ran_out_does_not_clobber_the_new_claim(
    insert_events, read_events, make_drainer, receiver, clock
):
    (row_id,) = insert_events([{"n": 0}])
    receiver.respond = lambda request: Reply(hang=True) if len(receiver.requests) == 1 else Reply(status=503)
    slow = make_drainer()
    thread, box = run_in_thread(slow.drain_once)
    try:
        receiver.wait_for(lambda r: len(r.requests) == 1)
        clock.advance(seconds=slow.options.lease_seconds)
        second = make_drainer().drain_once()  # the lease ran out: claimed again, answered 503
        assert second.claimed == 1 and second.retried == 1
    finally:
        receiver.release()
        thread.join(timeout=30)
    assert box["result"].lost_claims == 1 and box["result"].delivered == 0
    row = read_events()[row_id]
    assert row.status == "pending" and row.attempts == 2 and row.last_status_code == 503


# -- never raises, always returns its connections -----------------------------------------


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("where", ["dropped database", "closed port"])
def test_drain_once_never_raises_when_the_database_is_gone(
    database_factory, database_url, engine, insert_events, make_drainer, where
):
    if where == "dropped database":
        insert_events([{"n": 0}])  # leaves a pooled connection that the drop kills
        database_factory.drop(database_url)
        gone = engine
    else:
        url = f"postgresql://root@127.0.0.1:{closed_port()}/test"
        gone = create_engine(sqlalchemy_url(url), pool_size=2, max_overflow=0)
    try:
        result = make_drainer(gone).drain_once()
        assert result.error is not None and "OperationalError" in result.error
        assert result.claimed == 0
        assert gone.pool.checkedout() == 0
    finally:
        gone.dispose()


def test_drain_once_returns_its_connections_when_the_database_goes_away_mid_batch(
    database_factory, database_url, engine, insert_events, make_drainer, receiver
):
    insert_events([{"n": n} for n in range(4)])
    receiver.respond = lambda request: Reply(hang=True)
    thread, box = run_in_thread(make_drainer().drain_once)
    try:
        receiver.wait_for(lambda r: len(r.requests) == 4)
        database_factory.drop(database_url)  # terminates every backend of the test database
    finally:
        receiver.release()
        thread.join(timeout=30)
    result = box["result"]
    assert result.error is not None and result.delivered == 0
    assert engine.pool.checkedout() == 0


# -- scheduled rows ---------------------------------------------------------------


def test_a_scheduled_row_is_not_sent_before_its_time(insert_events, read_events, make_drainer, receiver, clock):
    send_at = clock.now() + timedelta(hours=1)
    (row_id,) = insert_events([{"n": 0}], next_attempt_at=send_at)
    drainer = make_drainer()

    assert drainer.drain_once().claimed == 0
    clock.set(send_at - timedelta(microseconds=1))
    assert drainer.drain_once().claimed == 0
    assert receiver.requests == []

    clock.set(send_at)
    assert drainer.drain_once().delivered == 1
    assert read_events()[row_id].status == "done" and len(receiver.requests) == 1


def test_a_send_never_starts_with_its_rows_lease_nearly_over(engine, clock, insert_events, read_events):
    """Lease outlasts every send: a row whose lease ran down while it waited (a paused process) is not sent."""
    import dataclasses

    from outboxkit import CallableTransport, Drainer
    from tests.support.models import SampleEvent

    options = dataclasses.replace(SampleEvent.__outbox__, batch_size=2, concurrency=1)
    sent = []

    def handler(delivery, key):
        sent.append(delivery.json["n"])
        clock.advance(seconds=options.lease_seconds)  # the process stalls for a whole lease mid-batch
        return 200

    first, second = insert_events([{"n": 1}, {"n": 2}])
    drainer = Drainer(engine, SampleEvent, transport=CallableTransport(handler), clock=clock, options=options)
    try:
        result = drainer.drain_once()
    finally:
        drainer.close()
    assert sent == [1], "the second row's lease was over before its send could start: it was not sent"
    rows = read_events()
    assert rows[first].status == "done"
    assert rows[second].status == "pending" and rows[second].last_error.startswith("not sent:")
    assert result.retried >= 1


def test_a_stop_handled_before_the_claims_clock_reading_prevents_the_claim(insert_events, read_events, make_drainer, clock):
    # The drain asks whether it may claim again after reading the clock the lease is computed from: a stop
    # that lands between the loop's first question and that reading (a signal handled on a busy host)
    # still claims nothing, so no claim's own time ever follows the stop.
    from outboxkit.results import DrainResult

    ids = insert_events([{"n": 1}, {"n": 2}])
    stop = threading.Event()
    drainer = make_drainer()
    reading = clock.now

    def now_then_stop():
        moment = reading()
        stop.set()  # the signal is handled right after the claim's clock reading
        return moment

    clock.now = now_then_stop
    rows, _, taken, _ = drainer.claimer.claim(10, DrainResult(job_name="sample-events"), lambda: not stop.is_set())
    assert (rows, taken) == ([], 0)
    assert all(row.attempts == 0 and row.claim_token is None for row in read_events().values())
    assert sorted(read_events()) == ids
