"""The leader election against a real PostgreSQL: one holder, promotion, demotion, fail direction."""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy import text

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.leader.election import ElectionState, LeaderElection, current_leader, lock_holders
from outboxkit.schedules.jobs import every
from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY
from tests.support.leadership import Recorder, holder_count, terminate_backend, wait_until
from tests.support.models import SampleEvent

# These tests exercise the elected scheduler's registry through kit.scheduler.add_job, deprecated but kept
# working (tests/integration/test_scheduler_deprecation.py pins its warning).
pytestmark = pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")

FAST = {"leader_tick_seconds": 0.1, "standby_probe_seconds": 0.2}


def election(database_url: str, recorder: Recorder, **options: object) -> LeaderElection:
    return LeaderElection(
        dsn=database_url, on_elected=recorder.on_elected, on_demoted=recorder.on_demoted, **{**FAST, **options}
    )


def test_lock_is_granted_when_uncontended_and_a_job_body_runs_under_it(engine, database_url):
    settings = OutboxKitSettings(leader_tick_seconds=0.1, standby_probe_seconds=0.2)
    seen_holders: list[list[int]] = []

    def check_holder(context):
        seen_holders.append([holder.backend_pid for holder in lock_holders(context.session.connection())])
        return {"checked": 1}

    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    try:
        kit.scheduler.add_job("test.check-holder", check_holder, every(seconds=0.05))
        leader = kit.scheduler.elect()
        assert leader.wait_for(ElectionState.LEADER, timeout=10)
        wait_until(lambda: seen_holders, message="a job run")
        assert seen_holders[0] == [leader.backend_pid]
        holder = current_leader(engine)
        assert (holder.host, holder.pid, holder.backend_pid) == (socket.gethostname(), os.getpid(), leader.backend_pid)
        assert holder.since is not None
    finally:
        kit.close()
    assert holder_count(engine) == 0


@dataclass
class Pair:
    leader: LeaderElection
    leader_recorder: Recorder
    standby: LeaderElection
    standby_recorder: Recorder


@pytest.fixture
def leader_and_standby(database_url):
    """Two elections in this process: the first leads, the second has campaigned and stands by."""
    pair = Pair(*(item for _ in range(2) for item in _election_with_recorder(database_url)))
    try:
        pair.leader.start()
        assert pair.leader.wait_for(ElectionState.LEADER, timeout=10)
        pair.standby.start()
        assert pair.standby.wait_for(ElectionState.STANDBY, campaigns=2, timeout=10)
        yield pair
    finally:
        pair.leader.stop()
        pair.standby.stop()


def _election_with_recorder(database_url: str) -> tuple[LeaderElection, Recorder]:
    recorder = Recorder()
    return election(database_url, recorder), recorder


def test_two_elections_in_one_process_give_one_holder_and_one_scheduler(engine, leader_and_standby):
    pair = leader_and_standby
    assert holder_count(engine) == 1
    assert pair.leader_recorder.count("elected") == 1
    assert pair.standby_recorder.count("elected") == 0
    assert pair.standby.state is ElectionState.STANDBY


def _lead_in_child(dsn: str, leading, stop, elected_count) -> None:
    def on_elected() -> None:
        with elected_count.get_lock():
            elected_count.value += 1

    child = LeaderElection(dsn=dsn, on_elected=on_elected, on_demoted=lambda wait: None, **FAST)
    child.start()
    if child.wait_for(ElectionState.LEADER, timeout=20):
        leading.set()
    stop.wait(60)
    child.stop()


def test_two_elections_in_two_processes_give_one_holder_and_one_scheduler(engine, database_url):
    context = multiprocessing.get_context("spawn")
    leading, stop, elected_count = context.Event(), context.Event(), context.Value("i", 0)
    process = context.Process(target=_lead_in_child, args=(database_url, leading, stop, elected_count))
    recorder = Recorder()
    local = election(database_url, recorder)
    process.start()
    try:
        assert leading.wait(30), "the child process never led"
        local.start()
        assert local.wait_for(ElectionState.STANDBY, campaigns=2, timeout=10)
        with engine.connect() as connection:
            holders = lock_holders(connection)
        assert [holder.pid for holder in holders] == [process.pid]
        assert elected_count.value == 1
        assert recorder.count("elected") == 0
    finally:
        local.stop()
        stop.set()
        process.join(15)
        if process.is_alive():
            process.kill()
            process.join()


def test_released_lock_lets_a_new_holder_in(engine, leader_and_standby):
    pair = leader_and_standby
    pair.leader.stop()
    assert pair.leader.state is ElectionState.STOPPED
    assert pair.leader_recorder.events == ["elected", "demoted(wait=True)"]
    assert pair.standby.wait_for(ElectionState.LEADER, timeout=10)
    assert holder_count(engine) == 1


def test_standby_promotes_after_clean_shutdown_and_waits_one_tick_before_its_first_job(engine, database_url):
    first = election(database_url, Recorder())
    recorder = Recorder()
    promotion_waits: list[float] = []
    release = threading.Event()

    def held_sleep(seconds: float, stopping: threading.Event) -> bool:
        if standby.state is ElectionState.PROMOTING:
            promotion_waits.append(seconds)
            while not (release.is_set() or stopping.is_set()):
                stopping.wait(0.01)
            return stopping.is_set()
        return stopping.wait(seconds)

    standby = election(database_url, recorder, leader_tick_seconds=0.25, sleep=held_sleep)
    try:
        first.start()
        assert first.wait_for(ElectionState.LEADER, timeout=10)
        standby.start()
        assert standby.wait_for(ElectionState.STANDBY, campaigns=1, timeout=10)
        first.stop()
        wait_until(lambda: promotion_waits, message="the standby acquiring the lock")
        # It holds the lock but starts nothing until one leader tick has passed.
        assert promotion_waits == [0.25]
        assert holder_count(engine) == 1
        assert recorder.count("elected") == 0
        release.set()
        assert standby.wait_for(ElectionState.LEADER, timeout=10)
        assert recorder.events == ["elected"]
    finally:
        first.stop()
        standby.stop()


def test_transaction_level_advisory_lock_is_released_by_commit(database_url):
    # Why no job relies on pg_advisory_xact_lock for idempotency: the first
    # commit inside the job gives the lock away while the job still runs.
    with psycopg.connect(database_url) as job, psycopg.connect(database_url, autocommit=True) as other:
        assert job.execute("SELECT pg_try_advisory_xact_lock(%s::bigint)", [DEFAULT_ADVISORY_LOCK_KEY]).fetchone()[0]
        assert not other.execute("SELECT pg_try_advisory_xact_lock(%s::bigint)", [DEFAULT_ADVISORY_LOCK_KEY]).fetchone()[0]
        job.commit()
        assert other.execute("SELECT pg_try_advisory_lock(%s::bigint)", [DEFAULT_ADVISORY_LOCK_KEY]).fetchone()[0]


def test_leader_demotes_when_its_lock_connection_is_terminated(engine, database_url):
    settings = OutboxKitSettings(leader_tick_seconds=0.1, standby_probe_seconds=30)
    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    fresh = election(database_url, Recorder())
    try:
        leader = kit.scheduler.elect()
        assert leader.wait_for(ElectionState.LEADER, timeout=10)
        wait_until(lambda: kit.scheduler.running, message="the scheduler starting")
        terminate_backend(database_url, leader.backend_pid)
        assert leader.wait_for(ElectionState.STANDBY, timeout=10)
        assert not kit.scheduler.running
        assert leader.backend_pid is None
        assert holder_count(engine) == 0
        fresh.start()
        assert fresh.wait_for(ElectionState.LEADER, timeout=10)
        assert holder_count(engine) == 1
    finally:
        fresh.stop()
        kit.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("environment", "starts_scheduler", "level"),
    [("production", False, logging.ERROR), ("development", True, logging.WARNING)],
)
def test_election_error_fails_closed_in_production_and_open_elsewhere(
    engine, caplog, environment, starts_scheduler, level
):
    settings = OutboxKitSettings(
        environment=environment,
        lock_database_url=f"postgresql://root@127.0.0.1:{_closed_port()}/nowhere",
        leader_tick_seconds=0.1,
        standby_probe_seconds=0.2,
    )
    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    try:
        with caplog.at_level(logging.INFO, logger="outboxkit"):
            attempt = kit.scheduler.elect()
            assert attempt.wait_for(ElectionState.STANDBY, ElectionState.UNELECTED, campaigns=2, timeout=20)
            assert kit.scheduler.running is starts_scheduler
            assert attempt.state is (ElectionState.UNELECTED if starts_scheduler else ElectionState.STANDBY)
        failures = [record for record in caplog.records if "leader election failed" in record.getMessage()]
        assert [record.levelno for record in failures] == [level]  # logged once, not on every probe
    finally:
        kit.close()
    assert not kit.scheduler.running


def test_lock_holders_ignore_the_same_key_in_another_database(engine, database_factory):
    other_url = database_factory.create()
    try:
        with psycopg.connect(other_url, autocommit=True) as other:
            assert other.execute("SELECT pg_try_advisory_lock(%s::bigint)", [DEFAULT_ADVISORY_LOCK_KEY]).fetchone()[0]
            assert holder_count(engine) == 0
            with engine.connect() as connection:
                cluster_wide = connection.execute(
                    text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1")
                ).scalar()
            assert cluster_wide >= 1
    finally:
        database_factory.drop(other_url)
