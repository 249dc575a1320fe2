"""What an operator reads: the next five fire times in two timezones, one schedule's history by outcome."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from outboxkit.errors import InvalidValueError
from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.schedules.views import next_fire_times, schedule_history
from tests.support.schedules import ScheduleHarness, finish, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_the_next_five_fire_times_in_the_schedules_zone_and_the_viewers_across_a_clock_change(schedules: ScheduleHarness, clock):
    clock.set(datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
    schedules.job_schedule("nightly", ScheduleTrigger.cron(timezone="Europe/Berlin", hour=2, minute=30))
    times = next_fire_times(schedules.store.get("nightly"), viewer_timezone="America/New_York")
    assert [time.local.isoformat() for time in times] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00", "2026-04-01T02:30:00+02:00",
    ]
    assert [time.viewer.isoformat() for time in times][:2] == ["2026-03-27T21:30:00-04:00", "2026-03-28T21:30:00-04:00"]
    assert all(time.at.tzinfo == UTC and time.at == time.local == time.viewer for time in times)


def test_an_overdue_schedule_lists_its_due_time_first_and_a_disabled_one_none(schedules: ScheduleHarness, clock):
    schedules.job_schedule("tick", ScheduleTrigger.every(minutes=1))
    clock.advance(minutes=10)
    assert [time.at for time in next_fire_times(schedules.store.get("tick"), count=3)] == [
        NOON, NOON + timedelta(minutes=1), NOON + timedelta(minutes=2),
    ]
    schedules.store.set_enabled("tick", False, actor="test")
    assert next_fire_times(schedules.store.get("tick")) == []
    with pytest.raises(InvalidValueError, match="viewer_timezone: unknown IANA timezone 'Mars/Olympus'"):
        next_fire_times(schedules.store.get("tick"), viewer_timezone="Mars/Olympus")


def test_the_history_shows_runs_misses_and_abandoned_runs_newest_first(schedules: ScheduleHarness, clock):
    schedules.job_schedule("slow", ScheduleTrigger.every(minutes=1), job="blocking", misfire_grace_seconds=30)
    runner = schedules.runner(lease_seconds=30)
    stalled = runner.fire_due()  # 12:00 runs and stalls
    assert schedules.jobs.entered.acquire(timeout=30)
    clock.advance(minutes=3)  # its lease expires; 12:01 and 12:02 are missed beyond the grace, 12:03 due
    runner.sweep_expired_leases()
    later = runner.fire_due()
    schedules.jobs.gate.set()
    finish(later)
    finish(stalled)

    history = schedule_history(schedules.engine, "slow")
    assert [(run.scheduled_for, run.outcome) for run in history] == [
        (NOON + timedelta(minutes=3), "ok"), (NOON + timedelta(minutes=1), "missed"), (NOON, "ok"),
    ]
    assert history[1].counts == {"missed": 2} and history[0].holder == runner.holder
    missed = schedule_history(schedules.engine, "slow", outcomes=["missed", "abandoned"])
    assert [run.scheduled_for for run in missed] == [NOON + timedelta(minutes=1)]
    older = schedule_history(schedules.engine, "slow", before=NOON + timedelta(minutes=1), limit=1)
    assert [run.scheduled_for for run in older] == [NOON]
    with pytest.raises(InvalidValueError, match="unknown outcome"):
        schedule_history(schedules.engine, "slow", outcomes=["lost"])
