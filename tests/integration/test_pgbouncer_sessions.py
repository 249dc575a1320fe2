"""The lock and LISTEN connections behind a real PgBouncer: a transaction pool is refused, never two leaders.

PgBouncer 1.18 (Debian's) runs from a scratch folder in front of the test
server (``tests.support.pgbouncer``).  Through its transaction pool a
"connection" is no session: the tests point the lock or LISTEN connection at
it, with a pool of one server connection and with a pool of twenty, and
check the kit refuses it at start, catches it on the leader's tick when a
proof was fooled, and never lets two processes both believe they lead.
Through its session pool everything works.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings
from outboxkit.leader.election import ElectionState, LeaderElection
from outboxkit.leader.lock import key_predicate
from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY
from outboxkit.storage.notify import NotifyListener
from outboxkit.storage.sessions import TOKEN_SETTING, NotASessionError, SessionIdentity, end_stranded_backend
from tests.support.leadership import Recorder, holder_count, wait_until
from tests.support.models import SampleEvent
from tests.support.pgbouncer import PgBouncer

FAST = {"leader_tick_seconds": 0.1, "standby_probe_seconds": 0.2}
POOL_SIZES = [1, 20]


@pytest.fixture(scope="module")
def transaction_pools(database_factory) -> Iterator[dict[int, PgBouncer]]:
    """A transaction-mode PgBouncer per pool size (pools are per database, so tests do not share one)."""
    bouncers = {size: PgBouncer(database_factory.server, pool_mode="transaction", pool_size=size) for size in POOL_SIZES}
    try:
        for bouncer in bouncers.values():
            bouncer.start()
        yield bouncers
    finally:
        for bouncer in bouncers.values():
            bouncer.stop()


@pytest.fixture(scope="module")
def session_pool(database_factory) -> Iterator[PgBouncer]:
    with PgBouncer(database_factory.server, pool_mode="session", pool_size=20) as bouncer:
        yield bouncer


def kit_with(engine, **settings: object) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**{**FAST, "drain_interval_seconds": 3600, **settings}))


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_a_lock_url_through_the_transaction_pool_is_refused_at_start_in_production(
    engine, database_url, transaction_pools, pool_size
):
    url = transaction_pools[pool_size].url_for(database_url)
    kit = kit_with(engine, environment="production", lock_database_url=url)
    try:
        with pytest.raises(ConfigurationError) as refused:
            kit.scheduler.elect()
        message = str(refused.value)
        assert "OUTBOXKIT_LOCK_DATABASE_URL=" in message and "transaction" in message and "session-mode pool" in message
        assert isinstance(refused.value, NotASessionError)
        assert kit.scheduler.election is None and not kit.scheduler.running
        assert holder_count(engine) == 0
    finally:
        kit.close()


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_an_engine_through_the_transaction_pool_is_refused_as_the_lock_source_when_no_lock_url_is_set(
    database_url, transaction_pools, pool_size
):
    from sqlalchemy import create_engine

    from tests.support.database import sqlalchemy_url

    pooled = create_engine(
        sqlalchemy_url(transaction_pools[pool_size].url_for(database_url)), connect_args={"prepare_threshold": None}
    )
    kit = kit_with(pooled, environment="production")
    try:
        with pytest.raises(ConfigurationError, match="OUTBOXKIT_LOCK_DATABASE_URL is unset"):
            kit.scheduler.elect()
        # The lock and LISTEN connections come from one source: its refusal stands for the whole kit.
        with pytest.raises(ConfigurationError, match="refused its connections already.*OUTBOXKIT_LOCK_DATABASE_URL is unset"):
            kit.worker.start()
        assert not kit.worker.running, "a refused worker starts no drain loop either"
    finally:
        kit.close()
        pooled.dispose()


def test_outside_production_a_refused_lock_connection_runs_the_scheduler_unelected_and_takes_no_lock(
    engine, database_url, transaction_pools, caplog
):
    kit = kit_with(engine, environment="development", lock_database_url=transaction_pools[20].url_for(database_url))
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit"):
            election = kit.scheduler.elect()
            assert election.wait_for(ElectionState.UNELECTED, campaigns=3, timeout=20)
        assert isinstance(election.refusal, NotASessionError)
        assert kit.scheduler.running, "fail open: the scheduler runs, knowingly without the lock"
        assert election.backend_pid is None and holder_count(engine) == 0
        assert any("not a PostgreSQL session of its own" in record.getMessage() for record in caplog.records)
    finally:
        kit.close()


def _campaign_in_child(dsn: str, ready, leading, elected_count, stop) -> None:
    def on_elected() -> None:
        with elected_count.get_lock():
            elected_count.value += 1
        leading.value = 1

    def on_demoted(wait: bool) -> None:
        leading.value = 0

    child = LeaderElection(dsn=dsn, on_elected=on_elected, on_demoted=on_demoted, **FAST)
    child.start()
    child.wait_for(ElectionState.STANDBY, campaigns=3, timeout=30)
    ready.set()
    stop.wait(60)
    child.stop()


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_two_processes_with_the_lock_through_the_transaction_pool_never_both_lead(
    engine, database_url, transaction_pools, pool_size
):
    url = transaction_pools[pool_size].url_for(database_url)
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    leading, elected_count = context.Value("i", 0), context.Value("i", 0)
    process = context.Process(target=_campaign_in_child, args=(url, ready, leading, elected_count, stop))
    recorder = Recorder()
    local = LeaderElection(dsn=url, on_elected=recorder.on_elected, on_demoted=recorder.on_demoted, **FAST)
    samples: list[tuple[bool, bool, int]] = []
    process.start()
    try:
        local.start()
        assert ready.wait(60), "the child never finished three campaigns"
        assert local.wait_for(ElectionState.STANDBY, campaigns=6, timeout=30)
        for _ in range(50):  # both keep campaigning meanwhile (every 0.2 s)
            samples.append((local.state is ElectionState.LEADER, bool(leading.value), holder_count(engine)))
        assert isinstance(local.refusal, NotASessionError)
    finally:
        local.stop()
        stop.set()
        process.join(20)
        if process.is_alive():
            process.kill()
            process.join()
    assert not any(mine and theirs for mine, theirs, _ in samples), "two processes believed they led"
    assert [holders for _, _, holders in samples] == [0] * len(samples), "no lock is ever taken through the pool"
    assert recorder.count("elected") == 0 and elected_count.value == 0


class SteppedSleep:
    """The election's sleep, held until the test calls ``step()``: each tick happens when the test says."""

    def __init__(self) -> None:
        self._steps = threading.Semaphore(0)
        self.waiting = threading.Event()

    def __call__(self, seconds: float, stopping: threading.Event) -> bool:
        self.waiting.set()
        while not self._steps.acquire(timeout=0.05):
            if stopping.is_set():
                return True
        self.waiting.clear()
        return stopping.is_set()

    def step(self) -> None:
        self.waiting.clear()
        self._steps.release()


def fooled_proof(connection: psycopg.Connection, connect: object, *, purpose: str, source: str) -> SessionIdentity:
    """What a proof fooled by a busy pool returns: the backend the first statement ran on, no second look."""
    token = uuid.uuid4().hex
    pid, _, started = connection.execute(
        "SELECT pg_backend_pid(), set_config(%s, %s, false), "
        "(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())",
        [TOKEN_SETTING, token],
    ).fetchone()
    return SessionIdentity(backend_pid=pid, backend_start=started, token=token)


def test_a_leader_whose_lock_connection_moves_to_another_backend_demotes_on_its_tick_and_releases_the_lock(
    engine, database_url, transaction_pools, monkeypatch
):
    monkeypatch.setattr("outboxkit.leader.election.prove_session", fooled_proof)
    url = transaction_pools[20].url_for(database_url)
    recorder = Recorder()
    pinned = psycopg.connect(url, autocommit=True)

    def on_demoted(wait: bool) -> None:
        recorder.on_demoted(wait)
        pinned.execute("COMMIT")  # the backend it pinned is free again before the release runs

    sleep = SteppedSleep()
    election = LeaderElection(dsn=url, on_elected=recorder.on_elected, on_demoted=on_demoted, sleep=sleep, **FAST)
    try:
        election.start()
        assert election.wait_for(ElectionState.PROMOTING, timeout=20)
        lock_backend = election.backend_pid
        assert holder_count(engine) == 1
        sleep.step()  # the promotion tick: the pool is idle, so the statement lands on the lock's backend
        assert election.wait_for(ElectionState.LEADER, timeout=20)
        # Another client's transaction takes the backend the lock lives on (PgBouncer reuses it first).
        pinned.execute("BEGIN")
        assert pinned.execute("SELECT pg_backend_pid()").fetchone()[0] == lock_backend
        wait_until(sleep.waiting.is_set, message="the leader waiting for its next tick")
        sleep.step()  # the next tick runs on another backend: the lock is out of reach
        assert election.wait_for(ElectionState.STANDBY, timeout=20)
        assert recorder.events == ["elected", "demoted(wait=False)"]
        wait_until(lambda: holder_count(engine) == 0, timeout=20, message="the stranded lock released")
    finally:
        election.stop()
        pinned.close()


def test_a_lock_stranded_on_an_idle_pooled_backend_is_ended_by_pid_and_start_time(engine, database_url, transaction_pools):
    url = transaction_pools[20].url_for(database_url)
    with psycopg.connect(url, autocommit=True) as pooled:
        identity = fooled_proof(pooled, None, purpose="test", source="test")
        assert pooled.execute("SELECT pg_try_advisory_lock(%s::bigint)", [DEFAULT_ADVISORY_LOCK_KEY]).fetchone()[0]
    # The client is gone; PgBouncer keeps the server connection, and the lock with it.
    assert holder_count(engine) == 1
    predicate = key_predicate(DEFAULT_ADVISORY_LOCK_KEY)
    with psycopg.connect(database_url, autocommit=True) as direct:
        wrong_start = SessionIdentity(identity.backend_pid, identity.backend_start.replace(year=2000), identity.token)
        assert not end_stranded_backend(direct, wrong_start, lock_predicate=predicate), "another backend with that pid"
        assert end_stranded_backend(direct, identity, lock_predicate=predicate)
    wait_until(lambda: holder_count(engine) == 0, message="the stranded lock released")


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_a_listen_connection_through_the_transaction_pool_is_refused(database_url, transaction_pools, pool_size):
    woken = threading.Event()
    listener = NotifyListener(dsn=transaction_pools[pool_size].url_for(database_url), channels={"outboxkit_test": woken.set})
    listener.start()
    try:
        wait_until(lambda: listener.refusal is not None, timeout=20, message="the refusal")
        assert "the LISTEN connection" in str(listener.refusal) and "OUTBOXKIT_LOCK_DATABASE_URL" in str(listener.refusal)
        listener.stop()
        assert listener.generation == 0 and not woken.is_set()
    finally:
        listener.stop()


def test_outside_production_a_refused_listen_connection_leaves_the_drain_loops_running(
    engine, database_url, transaction_pools, receiver, insert_events
):
    kit = kit_with(engine, environment="development", lock_database_url=transaction_pools[1].url_for(database_url))
    try:
        (row_id,) = insert_events([{"n": 1}])
        kit.worker.start()  # no raise: the loops run on due times and polls, without NOTIFY
        assert kit.worker.running and kit.worker.listener is None
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=20)  # the loop's claim at start
    finally:
        kit.close()


def test_a_listener_whose_connection_moves_to_another_backend_stops_listening(
    database_url, transaction_pools, monkeypatch
):
    monkeypatch.setattr("outboxkit.storage.notify.prove_session", fooled_proof)
    url = transaction_pools[20].url_for(database_url)
    listener = NotifyListener(dsn=url, channels={"outboxkit_test": lambda: None}, session_check_seconds=0.1)
    listener.start()
    try:
        assert listener.wait_for_generation(1, timeout=20)
        listening_backend = listener._identity.backend_pid
        with psycopg.connect(url, autocommit=True) as pinned:
            pinned.execute("BEGIN")
            assert pinned.execute("SELECT pg_backend_pid()").fetchone()[0] == listening_backend
            wait_until(lambda: listener.refusal is not None, timeout=20, message="the listener's refusal")
        assert "moved to another server backend" in str(listener.refusal)
    finally:
        listener.stop()


def test_through_the_session_pool_the_lock_and_listen_connections_are_accepted(engine, database_url, session_pool):
    url = session_pool.url_for(database_url)
    kit = kit_with(engine, environment="production", lock_database_url=url)
    try:
        election = kit.scheduler.elect()
        assert election.wait_for(ElectionState.LEADER, timeout=20)
        assert election.refusal is None and holder_count(engine) == 1
        kit.worker.start()
        assert kit.worker.listener.wait_for_generation(1, timeout=20)
        assert kit.worker.listener.refusal is None
    finally:
        kit.close()
    assert holder_count(engine) == 0
