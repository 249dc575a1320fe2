"""Drain work in every process (DESIGN.md section 4): the drain loops, their wake-ups and their bounds.

Real PostgreSQL, a real receiver, the system clock: these tests are about
when rows are sent, so they watch the receiver, never a mock.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.clock import ManualClock
from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.receiver import Reply
from tests.support.worker_app import worker_command

ROOT = Path(__file__).resolve().parents[2]
# The safety-net poll and the interval drain are an hour away: only a wake-up or a due time can send.
QUIET = {"drain_interval_seconds": 3600, "leader_tick_seconds": 3600, "standby_probe_seconds": 3600}


def make_kit(engine, **settings) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**{**QUIET, **settings}))


def enqueue(engine, url: str, payloads: list[dict]) -> list[float]:
    """One transaction per row, as an application writes them; returns each commit's time.time()."""
    committed = []
    for payload in payloads:
        with Session(engine) as session, session.begin():
            session.add(SampleEvent(target_url=url, payload=payload))
        committed.append(time.time())
    return committed


def claimed_rows(engine) -> int:
    with engine.connect() as connection:
        statement = select(func.count()).where(SampleEvent.status == "pending", SampleEvent.claim_token.is_not(None))
        return connection.execute(statement).scalar_one()


def test_a_retry_is_sent_at_its_backoff_time_not_at_the_safety_net_poll(engine, receiver):
    # NOTIFY off: after the 503 only the loop's due-time timer can send the row again within the hour.
    kit = make_kit(engine, listen_enabled=False, outboxes={"sample_events": {"backoff": [2]}})
    answers = iter([Reply(status=503), Reply()])
    receiver.respond = lambda request: next(answers)
    try:
        enqueue(engine, receiver.url + "/events", [{"n": 1}])
        kit.worker.start()
        receiver.wait_for(lambda r: len(r.requests) == 2, timeout=20)
    finally:
        kit.close()
    waited = receiver.requests[1].received_at - receiver.requests[0].received_at
    assert 2.0 - 0.1 <= waited < 2.0 + 3.0, f"the retry came {waited:.2f}s after the failure; its backoff is 2s"
    with Session(engine) as session:
        row = session.scalars(select(SampleEvent)).one()
        assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("done", 2, 200, None)


def test_a_reset_row_is_delivered_at_once_not_at_the_safety_net_poll(engine, receiver):
    # The reset's NOTIFY is the only thing that can send the row within the hour (QUIET).
    from outboxkit.operations.service import OperationsService

    with Session(engine) as session, session.begin():
        row = SampleEvent(target_url=receiver.url + "/events", payload={"n": 1}, status="stuck", attempts=5,
                          last_error="HTTP 503", last_status_code=503)
        session.add(row)
        session.flush()
        row_id = row.id
    kit = make_kit(engine)
    try:
        kit.worker.start()
        assert kit.worker.listener.wait_for_generation(1, timeout=10)
        reset_at = time.time()
        assert OperationsService(kit).reset("sample-events", [row_id], actor="test").changed == 1
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=30)
        waited = receiver.requests[0].received_at - reset_at
    finally:
        kit.close()
    # The bound is 1 s; 5 s leaves a loaded machine room and is still an hour short of the poll.
    assert waited < 5.0, f"the reset row was sent {waited:.2f}s after the reset"
    with Session(engine) as session:
        assert session.get(SampleEvent, row_id).status == "done"


def test_a_started_worker_claims_at_once_without_waiting_for_leadership(engine, receiver, database_url):
    # Another session holds the leader key: this process stays a standby, and drains all the same.
    with psycopg.connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [DEFAULT_ADVISORY_LOCK_KEY])
        kit = make_kit(engine)
        try:
            enqueue(engine, receiver.url + "/events", [{"n": 1}])
            kit.worker.start()
            kit.scheduler.elect()
            receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
            assert not kit.scheduler.running
        finally:
            kit.close()


def test_one_hanging_receiver_does_not_hold_up_the_other_rows(engine, receiver):
    # Two rows hang (until the test releases them, well inside their 60 s deadline); the other rows
    # must keep flowing through the free send threads.
    overrides = {"timeout": 60.0, "concurrency": 4, "batch_size": 8}
    kit = make_kit(engine, outboxes={"sample_events": overrides})
    receiver.respond = lambda request: Reply(hang=True) if request.path == "/hang" else Reply()
    try:
        kit.worker.start()
        assert kit.worker.listener.wait_for_generation(1, timeout=10)
        enqueue(engine, receiver.url + "/hang", [{"hang": 1}, {"hang": 2}])
        receiver.wait_for(lambda r: r.in_flight == 2, timeout=10)
        committed = enqueue(engine, receiver.url + "/events", [{"n": n} for n in range(20)])
        receiver.wait_for(lambda r: sum(request.path == "/events" for request in r.requests) == 20, timeout=30)
        arrived = {request.body["n"]: request.received_at for request in receiver.requests if request.path == "/events"}
        assert receiver.in_flight >= 2, "the hanging sends are still out: everything else went past them"
    finally:
        receiver.release()
        kit.close()
    latencies = sorted(arrived[n] - committed[n] for n in range(20))
    p95 = latencies[int(0.95 * len(latencies)) - 1]
    assert p95 < 1.0, f"p95 first-send latency {p95:.2f}s behind two hanging sends (all: {latencies})"


def test_the_loop_and_a_concurrent_drain_of_one_outbox_never_hold_more_than_a_batch(engine, receiver):
    # Every answer waits for release(): rows pile up claimed.  Across the background loop and a
    # drain() called at the same time, this process may hold at most batch_size rows, so each
    # claimed row is sent within the rounds its lease is sized for.
    overrides = {"timeout": 20.0, "concurrency": 2, "batch_size": 6}
    kit = make_kit(engine, listen_enabled=False, outboxes={"sample_events": overrides})
    receiver.respond = lambda request: Reply(hang=True)
    enqueue(engine, receiver.url + "/events", [{"n": n} for n in range(30)])
    drainer = kit.drainer(SampleEvent)
    other = threading.Thread(target=drainer.drain)
    try:
        drainer.start()
        other.start()
        receiver.wait_for(lambda r: r.in_flight == 2, timeout=10)
        wait_until(lambda: drainer.in_flight == 6, message="the drainer holding a full batch")
        assert claimed_rows(engine) == 6
        assert receiver.max_in_flight == 2
    finally:
        receiver.release()
    wait_until(lambda: receiver.max_in_flight <= 2 and len(receiver.requests) >= 30, timeout=60, message="every row sent")
    other.join(timeout=60)
    kit.close()
    assert max(receiver.count_by_key().values()) == 1, "no row was sent twice"
    assert receiver.max_in_flight == 2


def test_stop_records_the_rows_in_flight_before_it_returns(engine, receiver):
    kit = make_kit(engine, listen_enabled=False)
    receiver.respond = lambda request: Reply(delay=0.5)
    enqueue(engine, receiver.url + "/events", [{"n": n} for n in range(5)])
    kit.worker.start()
    receiver.wait_for(lambda r: r.in_flight >= 1, timeout=10)
    kit.worker.stop()
    assert claimed_rows(engine) == 0, "every row that was sent has its outcome recorded"
    with Session(engine) as session:
        statuses = set(session.scalars(select(SampleEvent.status)))
    assert statuses <= {"done", "pending"}
    kit.close()


def test_lifespan_composes_with_the_apps_own_and_can_start_twice(engine, receiver):
    kit = make_kit(engine)
    events = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("app start")
        async with kit.lifespan(app):
            yield
        events.append("app stop")

    app = FastAPI(lifespan=lifespan)
    for n in (1, 2):  # two TestClients, as two tests would open them
        with TestClient(app):
            enqueue(engine, receiver.url + "/events", [{"n": n}])
            receiver.wait_for(lambda r, n=n: len(r.requests) == n, timeout=10)
            assert kit.worker.running
        assert not kit.worker.running
    assert [request.body for request in receiver.requests] == [{"n": 1}, {"n": 2}]
    assert events == ["app start", "app stop"] * 2


def test_the_worker_command_drains_until_sigterm_and_stops_cleanly(database_url, engine, receiver):
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "admin")]),
        "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": "3600",
    }
    enqueue(engine, receiver.url + "/events", [{"n": 1}])
    command = worker_command()
    process = subprocess.Popen(command, env=environment, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=30)
        enqueue(engine, receiver.url + "/events", [{"n": 2}])
        receiver.wait_for(lambda r: len(r.requests) == 2, timeout=30)
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, errors
    assert "received SIGTERM" in errors and "stopped draining sample-events" in errors


@pytest.mark.parametrize("name", ["nope"])
def test_the_worker_command_refuses_an_unknown_outbox(database_url, name):
    environment = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    command = worker_command("--outbox", name)
    finished = subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 1
    assert "no outbox named 'nope'" in finished.stderr


def test_a_missing_outbox_table_is_said_once_with_the_migration_to_run(database_factory, caplog):
    import logging

    from sqlalchemy import create_engine

    from tests.support.database import sqlalchemy_url

    url = database_factory.create_empty()  # no tables at all: the migrations were never run
    engine = create_engine(sqlalchemy_url(url))
    kit = make_kit(engine, listen_enabled=False)
    caplog.set_level(logging.DEBUG, logger="outboxkit")
    try:
        first, second = kit.drain(SampleEvent), kit.drain(SampleEvent)
        kit.worker.start()  # the loop fails the same way, and backs off
        wait_until(
            lambda: sum("sample_event_outbox" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) >= 2,
            timeout=30,
            message="the loop's repeats, at DEBUG",
        )
    finally:
        kit.close()
        engine.dispose()
        database_factory.drop(url)
    assert first.schema_problem and "sample_event_outbox" in first.error and "alembic upgrade" in first.error
    assert second.error == first.error
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("outboxkit")]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "sample_event_outbox" in errors[0].getMessage()


def test_the_lock_and_listen_connections_come_from_the_engine_and_its_hooks(database_url, receiver):
    from sqlalchemy import create_engine, event

    from outboxkit.leader.election import ElectionState
    from tests.support.database import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(database_url), pool_size=2)
    hooked: list[str] = []

    @event.listens_for(engine, "do_connect")
    def remember(dialect, record, cargs, cparams):  # e.g. where an IAM token would be fetched
        hooked.append(cparams.get("dbname", ""))

    kit = make_kit(engine, leader_tick_seconds=0.2)
    try:
        election = kit.scheduler.elect()
        kit.worker.start()
        assert election.wait_for(ElectionState.LEADER, timeout=20)
        assert kit.worker.listener.wait_for_generation(1, timeout=10)
        with psycopg.connect(database_url) as probe:
            names = {
                row[0]
                for row in probe.execute("SELECT application_name FROM pg_stat_activity WHERE datname = current_database()")
            }
        assert any(name.startswith("outboxkit-leader:") for name in names)
        assert any(name.startswith("outboxkit-listener:") for name in names)
        assert len(hooked) >= 2, "both session connections went through the engine's do_connect hook"
        # They were detached: no pool slot is held for them.  The drain loop holds one from its first claim (its
        # claims, outcomes and due-time reads run on it) and the leader's first drain borrows one now and then,
        # so wait for a moment when only the loop's is out; the two session connections, held for the kit's
        # life, would keep the count above one for good.
        # Those slots are the drain's own pool's (outboxkit.storage.drain_pool), never the application engine's.
        drain_pool = kit.drain_database.engine.pool
        wait_until(lambda: drain_pool.checkedout() == 1, timeout=30, message="only the drain loop's pool slot held")
    finally:
        kit.close()
        engine.dispose()


def test_an_answer_dripped_past_the_deadline_is_retried_and_never_sent_twice_at_once(engine, receiver):
    # Two kits drain the outbox at once (two processes would do the same): the first attempt's
    # answer drips for ~20 s, far past the 1 s deadline.  The send must end at its deadline and be
    # recorded as a timeout, so the row's lease never runs out under a live send and the other
    # drainer never sends it while the first is still being answered; the retry then gets its 200.
    overrides = {"timeout": 1.0, "backoff": [1]}
    kits = [make_kit(engine, listen_enabled=False, outboxes={"sample_events": overrides}) for _ in range(2)]
    answers = iter([Reply(status=200, body=b"x" * 200, drip=1, drip_pause=0.1)])
    receiver.respond = lambda request: next(answers, Reply())
    try:
        enqueue(engine, receiver.url + "/events", [{"n": 1}])
        for kit in kits:
            kit.worker.start()
        receiver.wait_for(lambda r: len(r.requests) == 2, timeout=30)
        wait_until(lambda: receiver.in_flight == 0, timeout=30, message="the retry answered")
        with Session(engine) as session:
            wait_until(lambda: session.scalar(select(SampleEvent.status)) == "done", timeout=30, message="the row done")
    finally:
        for kit in kits:
            kit.close()
    first, second = receiver.requests
    assert first.key == second.key
    assert 1.0 <= second.received_at - first.received_at < 1.0 + 1.0 + 5.0, "deadline, then the 1 s backoff"
    assert receiver.max_in_flight_by_key[first.key] == 1, "never sent again while an attempt was still out"
    with Session(engine) as session:
        row = session.scalars(select(SampleEvent)).one()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("done", 2, 200, None)


def test_the_apps_probes_say_live_and_ready_only_while_its_drain_loops_run(engine):
    from outboxkit.integration import liveness_app, readiness_app

    # Schedule rows off: this is the drain loops' readiness (the schedule loop's: test_schedule_readiness.py).
    kit = make_kit(engine, scheduler_enabled=False, listen_enabled=False, schedules_enabled=False)
    app = FastAPI(lifespan=kit.lifespan)
    app.add_route("/healthz", liveness_app())
    app.add_route("/readyz", readiness_app(kit))
    try:
        outside = TestClient(app)  # no lifespan: the drain loops never started
        not_ready = outside.get("/readyz")
        assert (not_ready.status_code, not_ready.text) == (503, "not ready: the drain loops are not running\n")
        assert outside.get("/healthz").text == "ok\n"
        with TestClient(app) as client:
            ready = client.get("/readyz")
            assert (ready.status_code, ready.text) == (200, "ready\n")
            assert client.get("/healthz").status_code == 200
    finally:
        kit.close()


def test_an_app_that_does_not_drain_is_ready_when_its_database_answers(engine):
    from sqlalchemy import create_engine

    from outboxkit.integration import readiness_app

    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nothing", connect_args={"connect_timeout": 5})
    for database, expected in ((engine, 200), (unreachable, 503)):
        kit = make_kit(database, scheduler_enabled=False, drain_enabled=False, schedules_enabled=False)
        app = FastAPI()
        app.add_route("/readyz", readiness_app(kit))
        try:
            answer = TestClient(app).get("/readyz")
        finally:
            kit.close()
        assert answer.status_code == expected, answer.text
    assert answer.text.startswith("not ready: the database does not answer: OperationalError")
    unreachable.dispose()


def count_claims(drainer) -> list[int]:
    """The rows each of the drainer's claims takes, in order, as the claims happen."""
    claims: list[int] = []
    claim = drainer.claimer.claim

    def counted(*args, **kwargs):
        answer = claim(*args, **kwargs)
        claims.append(answer[2])
        return answer

    drainer.claimer.claim = counted
    return claims


@contextlib.contextmanager
def idle_loop(kit: OutboxKit, receiver):
    """The kit's drain loop, started and past its first claim (on start, empty); yields (drainer, claims, url).

    ``claims`` lists the rows each claim took (``count_claims``); the kit is closed on exit.
    """
    drainer = kit.drainer(SampleEvent)
    claims = count_claims(drainer)
    try:
        kit.worker.start()
        wait_until(lambda: claims == [0], message="the loop's first claim, on start")
        yield drainer, claims, receiver.url + "/events"
    finally:
        kit.close()


def test_a_wake_up_that_finds_one_row_claims_once_and_a_row_locked_meanwhile_is_claimed_when_freed(engine, receiver):
    # No listener: the test's wake() calls are the loop's only wake-ups, so every claim is accounted for.
    clock = ManualClock(datetime.now(timezone.utc) + timedelta(minutes=1))  # rows inserted now are due
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**QUIET, listen_enabled=False), clock=clock)
    with idle_loop(kit, receiver) as (drainer, claims, url):
        enqueue(engine, url, [{"n": 0}])
        drainer.wake()
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
        wait_until(lambda: claimed_rows(engine) == 0, message="the outcome is recorded")
        # The claim took one row of the fifty it could: no second claim to find nothing (the due time is read instead).
        assert claims == [0, 1]

        # A due row another transaction holds is skipped by the short claim, and claimed once it is freed.
        with Session(engine) as session, session.begin():
            session.add(SampleEvent(target_url=url, payload={"n": 1}, next_attempt_at=clock.now() + timedelta(seconds=10)))
        with engine.connect() as blocker:
            blocker.execute(select(SampleEvent.id).where(SampleEvent.payload["n"].as_integer() == 1).with_for_update())
            clock.advance(seconds=20)  # due now, and locked
            enqueue(engine, url, [{"n": 2}])
            drainer.wake()  # the claim takes row 2 and skips row 1
            receiver.wait_for(lambda r: len(r.requests) == 2, timeout=10)
            blocker.rollback()
        receiver.wait_for(lambda r: len(r.requests) == 3, timeout=30)  # with no wake-up, well before the hour's poll
    assert [request.body["n"] for request in receiver.requests] == [0, 2, 1]


def test_a_send_that_hangs_does_not_hold_back_a_row_its_short_claim_skipped(engine, receiver):
    # A short claim's earliest-due read waits for the first outcome of its sends, but only briefly
    # (DUE_READ_DELAY_SECONDS): a row locked during the claim goes out while the claim's own send still hangs.
    kit = make_kit(engine, listen_enabled=False)  # the test's wake() is the loop's only wake-up
    receiver.respond = lambda request: Reply(hang=True) if request.body == {"n": 0} else Reply()
    with idle_loop(kit, receiver) as (drainer, _, url), contextlib.ExitStack() as cleanup:
        cleanup.callback(receiver.release)  # before the kit closes: its stop waits for the hung send
        enqueue(engine, url, [{"n": 1}])
        with engine.connect() as blocker:
            blocker.execute(select(SampleEvent.id).where(SampleEvent.payload["n"].as_integer() == 1).with_for_update())
            enqueue(engine, url, [{"n": 0}])
            drainer.wake()  # the claim takes row 0 (its send hangs) and skips the locked row 1
            receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
            blocker.rollback()
        receiver.wait_for(lambda r: len(r.requests) == 2, timeout=30)  # with no wake-up
        with Session(engine) as session:  # row 0's send is still out: no outcome recorded, its claim held
            first = session.execute(select(SampleEvent).where(SampleEvent.payload["n"].as_integer() == 0)).scalar_one()
            assert (first.status, first.last_error, first.claim_token is not None) == ("pending", None, True)
        assert [request.body["n"] for request in receiver.requests] == [0, 1]


def test_a_loop_whose_held_connection_died_while_idle_claims_on_a_fresh_one(engine, receiver, database_url, caplog):
    # The loop claims on the connection it holds for its outcomes.  A server restart or an idle timeout can end it
    # while the loop waits; the next wake-up's claim finds it broken and claims on a fresh one, with no failed drain.
    kit = make_kit(engine, listen_enabled=False)  # the test's wake() is the loop's only wake-up
    with idle_loop(kit, receiver) as (drainer, claims, url):
        with psycopg.connect(database_url, autocommit=True) as admin:  # as a server restart: every session ends
            others = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM ({others}) AS other")
            wait_until(lambda: not admin.execute(others).fetchall(), message="every other backend is gone")
        engine.dispose()  # the test's own inserts connect afresh; the loop still holds its dead connection
        kit.drain_database.dispose()  # and so do the drain's short reads: only the loop's held connection is dead
        with caplog.at_level("ERROR", logger="outboxkit.drain"):
            enqueue(engine, url, [{"n": 1}])
            drainer.wake()
            receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
            wait_until(lambda: claimed_rows(engine) == 0, message="the outcome is recorded")
    # The claim on the dead connection raised; the one on the fresh connection took the row.  A busy host may
    # add an empty claim after it (the loop's due-read fallback), which takes nothing.
    assert claims[:2] == [0, 1] and set(claims[2:]) <= {0}
    assert [record.getMessage() for record in caplog.records if record.name.startswith("outboxkit.drain.")] == []
    with Session(engine) as session:
        row = session.scalars(select(SampleEvent)).one()
        assert (row.status, row.attempts) == ("done", 1)


def test_a_held_connection_that_dies_between_a_claim_and_its_due_read_is_replaced_for_the_read(
    engine, receiver, database_url, caplog
):
    # An empty claim leaves the next due time to read at once, on the same held connection.  A server restart
    # between the two ends that connection: the read is made once more on a fresh one, with no failed drain.
    kit = make_kit(engine, listen_enabled=False)  # the test's wake() is the loop's only wake-up
    drainer = kit.drainer(SampleEvent)
    claim = drainer.claimer.claim
    claims: list[int] = []  # the rows each claim took, counted once it returned

    def claim_then_end_the_session(granted, result, may_claim, connection, **options):
        answer = claim(granted, result, may_claim, connection, **options)
        if len(claims) == 1:  # the wake-up's claim (the first, on start, is counted already): end its session
            pid = connection.connection.driver_connection.info.backend_pid
            with psycopg.connect(database_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                gone = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
                wait_until(lambda: admin.execute(gone, [pid]).fetchone() is None, message="the loop's session ended")
        claims.append(answer[2])
        return answer

    drainer.claimer.claim = claim_then_end_the_session
    try:
        with caplog.at_level("ERROR", logger="outboxkit.drain"):
            kit.worker.start()
            wait_until(lambda: claims == [0], message="the loop's first claim, on start")
            drainer.wake()  # finds nothing: its due read meets the ended session
            wait_until(lambda: claims == [0, 0], message="the wake-up's empty claim, its session ended")
            url = receiver.url + "/events"
            enqueue(engine, url, [{"n": 1}])
            drainer.wake()
            receiver.wait_for(lambda r: len(r.requests) == 1, timeout=10)
            wait_until(lambda: claimed_rows(engine) == 0, message="the outcome is recorded")
    finally:
        kit.close()
    assert claims == [0, 0, 1]  # no claim again after a failed drain
    assert [record.getMessage() for record in caplog.records if record.name.startswith("outboxkit.drain.")] == []
    with Session(engine) as session:
        row = session.scalars(select(SampleEvent)).one()
        assert (row.status, row.attempts) == ("done", 1)
