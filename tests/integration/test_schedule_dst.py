"""Daylight saving through the row engine: schedule rows in Europe/Berlin and America/New_York fire what
tests/test_jobs_triggers.py pins for the triggers, each occurrence once, with the clock stepped to each due time.

Berlin (2026): spring forward 29 March 01:00 UTC, fall back 25 October 01:00 UTC.
New York (2026): spring forward 8 March 07:00 UTC, fall back 1 November 06:00 UTC.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from outboxkit.schedules.definitions import ScheduleTrigger
from tests.support.schedules import finish, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc

# (case, trigger as data, created at (UTC), expected fire times (local wall time with its offset))
CASES = [
    ("cron Berlin 02:30 in the spring gap fires once, at 03:30 CEST",
     ScheduleTrigger.cron(timezone="Europe/Berlin", hour=2, minute=30), "2026-03-28T00:00",
     ["2026-03-28T02:30+01:00", "2026-03-29T03:30+02:00", "2026-03-30T02:30+02:00"]),
    ("cron Berlin 02:30 in the repeated hour fires in the first pass only",
     ScheduleTrigger.cron(timezone="Europe/Berlin", hour=2, minute=30), "2026-10-24T00:00",
     ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
    ("cron Berlin every 30 minutes runs in both passes of the repeated hour",
     ScheduleTrigger.cron(timezone="Europe/Berlin", minute="*/30"), "2026-10-25T00:00",
     ["2026-10-25T02:00+02:00", "2026-10-25T02:30+02:00", "2026-10-25T02:00+01:00", "2026-10-25T02:30+01:00",
      "2026-10-25T03:00+01:00"]),
    ("cron Berlin every 30 minutes keeps elapsed time across the gap",
     ScheduleTrigger.cron(timezone="Europe/Berlin", minute="*/30"), "2026-03-29T00:00",
     ["2026-03-29T01:00+01:00", "2026-03-29T01:30+01:00", "2026-03-29T03:00+02:00", "2026-03-29T03:30+02:00"]),
    ("cron New York 02:30 in the spring gap fires once, at 03:30 EDT",
     ScheduleTrigger.cron(timezone="America/New_York", hour=2, minute=30), "2026-03-07T12:00",
     ["2026-03-08T03:30-04:00", "2026-03-09T02:30-04:00"]),
    ("cron New York 01:30 in the repeated hour fires in the first pass only",
     ScheduleTrigger.cron(timezone="America/New_York", hour=1, minute=30), "2026-10-31T12:00",
     ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"]),
    ("cron New York every 30 minutes runs in both passes of the repeated hour",
     ScheduleTrigger.cron(timezone="America/New_York", minute="*/30"), "2026-11-01T05:00",
     ["2026-11-01T01:00-04:00", "2026-11-01T01:30-04:00", "2026-11-01T01:00-05:00", "2026-11-01T01:30-05:00",
      "2026-11-01T02:00-05:00"]),
    ("calendar daily 02:30 Berlin: the day of the gap fires at 03:30 CEST",
     ScheduleTrigger.calendar_interval(timezone="Europe/Berlin", days=1, hour=2, minute=30), "2026-03-28T00:00",
     ["2026-03-28T02:30+01:00", "2026-03-29T03:30+02:00", "2026-03-30T02:30+02:00"]),
    ("calendar daily 02:30 Berlin: the repeated hour fires in the first pass only",
     ScheduleTrigger.calendar_interval(timezone="Europe/Berlin", days=1, hour=2, minute=30), "2026-10-24T00:00",
     ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
    ("calendar daily 02:30 New York: the day of the gap fires at 03:30 EDT",
     ScheduleTrigger.calendar_interval(timezone="America/New_York", days=1, hour=2, minute=30), "2026-03-07T12:00",
     ["2026-03-08T03:30-04:00", "2026-03-09T02:30-04:00"]),
    ("calendar monthly 01:30 New York: 1 November's repeated hour fires in the first pass",
     ScheduleTrigger.calendar_interval(timezone="America/New_York", months=1, hour=1, minute=30), "2026-10-15T00:00",
     ["2026-11-01T01:30-04:00", "2026-12-01T01:30-05:00"]),
    ("every hour across the Berlin repeated hour: both passes fire",
     ScheduleTrigger.every(hours=1), "2026-10-25T00:00",
     ["2026-10-25T02:00+02:00", "2026-10-25T02:00+01:00", "2026-10-25T03:00+01:00"]),
    ("once at 02:30 Berlin on fall-back day, second pass",
     ScheduleTrigger.once(at="2026-10-25T02:30:00+01:00"), "2026-10-24T00:00", ["2026-10-25T02:30+01:00"]),
]


@pytest.mark.parametrize(("case", "trigger", "created", "expected"), CASES, ids=[case[0] for case in CASES])
def test_fire_times_across_daylight_saving_through_the_rows(schedules, clock, case, trigger, created, expected):
    clock.set(datetime.fromisoformat(created).replace(tzinfo=UTC))
    schedules.job_schedule("dst", trigger, misfire_grace_seconds=0)
    runners = [schedules.runner(), schedules.runner()]
    for step in range(len(expected)):
        due = schedules.next_run_at("dst")
        assert due is not None, f"no next occurrence after {step} run(s)"
        clock.set(due)
        for runner in runners:  # both processes look at the due instant; one fires it
            finish(runner.fire_due())
    expected_utc = [datetime.fromisoformat(moment).astimezone(UTC) for moment in expected]
    assert schedules.jobs.calls == [("dst", moment) for moment in expected_utc]
    assert schedules.history("dst") == [(moment, "ok") for moment in expected_utc]  # nothing missed or doubled
