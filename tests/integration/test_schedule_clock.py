"""Schedules decide due and expired times by the database server's clock, whatever the host's clock says.

The runners and stores here get an ``OffsetClock`` (the system clock off by
some amount, as a drifted host reads it); only a ``ManualClock`` stands in for
the server's clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text

from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.runner import ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from tests.support.clocks import OffsetClock
from tests.support.schedules import FUTURE_TIMEOUT, JobCalls

HOUR = timedelta(hours=1)


def every_minute(engine, calls: JobCalls, job: str = "record", *, minutes: int = 1) -> ScheduleStore:
    store = ScheduleStore(engine, jobs=calls.functions())
    store.create(
        ScheduleDefinition(name="tick", trigger=ScheduleTrigger.every(minutes=minutes), target=JobTarget(job=job)),
        actor="test",
    )
    return store


def database_now(engine) -> datetime:
    with engine.connect() as connection:
        return connection.execute(text("SELECT clock_timestamp()")).scalar_one()


def test_a_clock_an_hour_ahead_neither_fires_early_nor_records_misses(engine):
    calls = JobCalls()
    # Due within the next half hour (well inside the hour the runner's clock is ahead), so the row would fire early by
    # that clock; every 30 minutes rather than every minute, so a loaded host does not cross the due time by the
    # server's clock while the test runs (it then fires, rightly: seen once in a fresh clone under load).
    store = every_minute(engine, calls, minutes=30)
    due = store.get("tick").next_run_at
    runner = ScheduleRunner(engine, jobs=calls.functions(), clock=OffsetClock(HOUR))
    try:
        firing = runner.run_pending()
        assert runner.seconds_until_due() > 0  # it sleeps until the row is due by the server's clock
    finally:
        runner.stop()
    assert firing.runs == [] and firing.missed == [] and calls.calls == []
    assert store.get("tick").next_run_at == due


def test_a_clock_an_hour_behind_renews_its_leases_by_the_servers_clock(engine):
    calls = JobCalls()
    store = every_minute(engine, calls, job="blocking")
    store.run_now("tick", actor="test")
    runner = ScheduleRunner(engine, jobs=calls.functions(), clock=OffsetClock(-HOUR), lease_seconds=30)
    try:
        started = runner.fire_due()
        assert calls.entered.acquire(timeout=FUTURE_TIMEOUT)
        assert runner.renew_leases() == 1
        with engine.connect() as connection:
            expires_at = connection.execute(text("SELECT expires_at FROM outboxkit_schedule_leases")).scalar_one()
        # Not an hour early, which every other process would sweep as expired at once.
        assert timedelta(seconds=20) < expires_at - database_now(engine) <= timedelta(seconds=30)
        calls.gate.set()
        assert [run.result(timeout=FUTURE_TIMEOUT).outcome for run in started.runs] == ["ok"]
    finally:
        calls.gate.set()
        runner.stop()


def test_a_clock_slightly_ahead_never_starts_a_run_before_its_fire_time(engine):
    """Within a couple of seconds of the server's, a host's clock was once trusted: it fired that much early."""
    calls = JobCalls()
    store = every_minute(engine, calls)
    with engine.begin() as connection:  # due 1.5 s from now by the server's clock; the host's is 1.9 s ahead
        connection.execute(text("UPDATE outboxkit_schedules SET next_run_at = clock_timestamp() + interval '1.5 s'"))
    runner = ScheduleRunner(engine, jobs=calls.functions(), clock=OffsetClock(timedelta(seconds=1.9)))
    try:
        runner.run_pending()
    finally:
        runner.stop()
    with engine.connect() as connection:
        early = connection.execute(
            text("SELECT count(*) FROM outboxkit_job_runs WHERE job_name = 'tick' AND started_at < scheduled_for")
        ).scalar_one()
    assert early == 0  # it ran at or after its fire time (a slow host may reach it), never before
    assert store.get("tick").name == "tick"


def test_run_now_from_a_host_whose_clock_is_behind_runs_now_instead_of_being_missed(engine):
    calls = JobCalls()
    every_minute(engine, calls, minutes=30)
    behind = ScheduleStore(engine, jobs=calls.functions(), clock=OffsetClock(-HOUR))  # past the 300 s grace
    behind.run_now("tick", actor="test")
    runner = ScheduleRunner(engine, jobs=calls.functions())
    try:
        firing = runner.run_pending()
    finally:
        runner.stop()
    assert firing.missed == [] and len(firing.runs) == 1 and len(calls.calls) == 1
