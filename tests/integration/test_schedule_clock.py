"""A runner whose clock is off the database server's decides due and expired times by the server's clock."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from outboxkit.clock import ManualClock
from outboxkit.schedules.clock import CheckedClock
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


def test_a_clock_an_hour_ahead_neither_fires_early_nor_records_misses(engine, caplog):
    calls = JobCalls()
    # Due within the next half hour (well inside the hour the runner's clock is ahead), so the row would fire early by
    # that clock; every 30 minutes rather than every minute, so a loaded host does not cross the due time by the
    # server's clock while the test runs (it then fires, rightly: seen once in a fresh clone under load).
    store = every_minute(engine, calls, minutes=30)
    due = store.get("tick").next_run_at
    runner = ScheduleRunner(engine, jobs=calls.functions(), clock=OffsetClock(HOUR))
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit.schedules.runner"):
            firing = runner.run_pending()
            assert runner.seconds_until_due() > 0  # it sleeps until the row is due by the server's clock
    finally:
        runner.stop()
    assert firing.runs == [] and firing.missed == [] and calls.calls == []
    assert store.get("tick").next_run_at == due
    skews = [record for record in caplog.records if getattr(record, "event_name", "") == "schedule.clock_skew"]
    assert len(skews) == 1 and 3590 < skews[0].offset_seconds < 3610  # logged once, not per transaction


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


def test_a_clock_that_agrees_again_is_used_again(engine, caplog):
    clock = OffsetClock(HOUR)
    checked = CheckedClock(clock)
    with engine.connect() as connection, caplog.at_level(logging.WARNING, logger="outboxkit.schedules.runner"):
        stepped = checked.check(connection)
        clock.step(-HOUR)
        back = checked.check(connection)
    assert abs(stepped - database_now(engine)) < timedelta(seconds=30)
    assert checked.correction == timedelta(0) and abs(back - datetime.now(timezone.utc)) < timedelta(seconds=30)
    events = [getattr(record, "event_name", "") for record in caplog.records]
    assert events == ["schedule.clock_skew", "schedule.clock_agrees"]


def test_a_manual_clock_is_a_tests_time_and_never_corrected(engine):
    manual = ManualClock(datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc))
    checked = CheckedClock(manual)
    with engine.connect() as connection:
        assert checked.check(connection) == manual.now()
    assert not checked.checked


class SteppingClock:
    """The system clock, stepped an hour forward after its first reading."""

    def __init__(self) -> None:
        self.readings = 0

    def now(self) -> datetime:
        self.readings += 1
        return datetime.now(timezone.utc) + (HOUR if self.readings > 1 else timedelta(0))


def test_a_clock_that_steps_while_the_servers_is_read_decides_by_the_servers_time(engine, caplog):
    checked = CheckedClock(SteppingClock())
    with engine.connect() as connection, caplog.at_level(logging.WARNING, logger="outboxkit.schedules.runner"):
        decided = checked.check(connection)  # before the step, the server's time, after the step: inconclusive
        assert abs((decided - database_now(engine)).total_seconds()) < 2  # not the stepped clock's time
        assert checked.correction == timedelta(0)  # the reading measured no offset
        assert not [record for record in caplog.records if getattr(record, "event_name", "") == "schedule.clock_skew"]
        decided = checked.check(connection)  # a whole reading after the step: the offset is measured
        assert abs((decided - database_now(engine)).total_seconds()) < 2
        assert 3590 < -checked.correction.total_seconds() < 3610
    skews = [record for record in caplog.records if getattr(record, "event_name", "") == "schedule.clock_skew"]
    assert len(skews) == 1
