"""Driving schedules from a user's tests: ``run_pending`` with a ManualClock, ``run_job``, a stopped runner restarting."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from outboxkit.errors import UnknownScheduleError
from outboxkit.schedules import ScheduleTrigger
from tests.support.leadership import wait_until
from tests.support.schedules import ScheduleHarness, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_run_pending_fires_what_the_manual_clock_made_due_and_waits_for_it(schedules: ScheduleHarness, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    runner = schedules.runner()
    assert runner.run_pending().runs[0].result().outcome == "ok"  # 12:00 is due at once
    assert runner.run_pending().runs == []  # nothing more until the clock moves
    clock.advance(hours=1)
    firing = runner.run_pending()
    assert all(run.done() for run in firing.runs)
    assert schedules.history("hourly") == [(NOON, "ok"), (NOON + timedelta(hours=1), "ok")]


def test_run_job_runs_one_occurrence_now_under_the_fence_and_leaves_the_schedule_alone(schedules: ScheduleHarness, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    runner = schedules.runner()
    clock.advance(minutes=10)

    record = runner.run_job("hourly")

    assert (record.outcome, record.counts) == ("ok", {"calls": 1})
    assert schedules.jobs.calls == [("hourly", NOON + timedelta(minutes=10))]
    assert schedules.next_run_at("hourly") == NOON  # its own 12:00 is still due
    assert runner.run_job("hourly").outcome == "skipped"  # the same instant again: the fence
    assert schedules.leases() == []


def test_run_job_of_an_http_schedule_enqueues_it(schedules: ScheduleHarness, receiver):
    schedules.http_schedule("ping", ScheduleTrigger.every(hours=1), receiver.url + "/ping")
    record = schedules.runner().run_job("ping", scheduled_for=NOON + timedelta(minutes=5))
    [call] = schedules.calls()
    assert (record.outcome, record.counts) == ("enqueued", {"outbox_row": call["id"]})
    assert call["scheduled_for"] == NOON + timedelta(minutes=5)


def test_run_job_of_an_unknown_schedule_is_a_lookup_error(schedules: ScheduleHarness):
    with pytest.raises(UnknownScheduleError, match="no schedule named 'nope'"):
        schedules.runner().run_job("nope")


def test_a_stopped_runner_starts_again(schedules: ScheduleHarness, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    runner = schedules.runner()
    runner.start()
    wait_until(lambda: len(schedules.jobs.calls) == 1, timeout=30, message="the first run")
    runner.stop()
    clock.advance(hours=1)
    runner.start()
    both = [(NOON, "ok"), (NOON + timedelta(hours=1), "ok")]
    wait_until(lambda: schedules.history("hourly") == both, timeout=30, message="the run after the restart")
    assert len(schedules.jobs.calls) == 2
