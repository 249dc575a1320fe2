"""plan_firing: one run for the latest occurrence within the grace, the older ones counted as missed (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.schedules.misfires import COALESCED_COUNT_LIMIT, MISSED_COUNT_LIMIT, plan_firing

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_an_on_time_occurrence_runs_and_nothing_is_missed():
    plan = plan_firing(ScheduleTrigger.every(minutes=1), due=NOON, now=NOON, grace=timedelta(0))
    assert (plan.run_for, plan.missed_first, plan.next_run_at) == (NOON, None, NOON + timedelta(minutes=1))


def test_a_week_of_every_second_is_counted_as_more_than_the_limit_and_planned_at_once():
    now = NOON + timedelta(days=7, milliseconds=500)
    plan = plan_firing(ScheduleTrigger.every(seconds=1), due=NOON, now=now, grace=timedelta(seconds=10))
    assert plan.run_for == NOON + timedelta(days=7)
    assert (plan.missed_first, plan.missed_last) == (NOON, NOON + timedelta(days=7, seconds=-10))
    assert (plan.missed_count, plan.missed_count_exact) == (MISSED_COUNT_LIMIT, False)
    assert "more than 1000 occurrence(s)" in plan.describe_missed(timedelta(seconds=10))
    assert plan.next_run_at == NOON + timedelta(days=7, seconds=1)


def test_a_run_now_instant_off_the_trigger_grid_is_an_occurrence_of_its_own():
    asked = NOON + timedelta(minutes=20, seconds=7)
    plan = plan_firing(ScheduleTrigger.every(hours=1), due=asked, now=asked + timedelta(seconds=1), grace=timedelta(minutes=5))
    assert (plan.run_for, plan.missed_first, plan.next_run_at) == (asked, None, NOON + timedelta(hours=1))
    late = plan_firing(ScheduleTrigger.every(hours=1), due=asked, now=asked + timedelta(minutes=10), grace=timedelta(minutes=5))
    assert (late.run_for, late.missed_first, late.missed_count) == (None, asked, 1)


def test_a_once_beyond_its_grace_is_missed_and_never_due_again():
    at = NOON
    plan = plan_firing(ScheduleTrigger.once(at=at), due=at, now=at + timedelta(hours=1), grace=timedelta(minutes=5))
    assert (plan.run_for, plan.missed_first, plan.missed_count, plan.next_run_at) == (None, at, 1, None)


def test_the_late_run_counts_the_earlier_fire_times_within_the_grace_that_it_covers():
    on_time = plan_firing(ScheduleTrigger.every(seconds=1), due=NOON, now=NOON + timedelta(milliseconds=5),
                          grace=timedelta(minutes=5))
    assert (on_time.run_for, on_time.coalesced_count) == (NOON, 0)
    late = plan_firing(ScheduleTrigger.every(seconds=1), due=NOON, now=NOON + timedelta(seconds=3, milliseconds=5),
                       grace=timedelta(minutes=5))
    assert (late.run_for, late.coalesced_count) == (NOON + timedelta(seconds=3), 3)  # 12:00:00 to 12:00:02
    week = plan_firing(ScheduleTrigger.every(seconds=1), due=NOON, now=NOON + timedelta(days=7, milliseconds=500),
                       grace=timedelta(seconds=10))
    assert (week.missed_last, week.coalesced_count) == (NOON + timedelta(days=7, seconds=-10), 9)  # the rest missed
    asked = NOON + timedelta(minutes=20, seconds=7)  # a run-now instant, then the 13:00 fire time, both within grace
    both = plan_firing(ScheduleTrigger.every(hours=1), due=asked, now=NOON + timedelta(hours=1, minutes=1),
                       grace=timedelta(hours=1))
    assert (both.run_for, both.coalesced_count) == (NOON + timedelta(hours=1), 1)


def test_a_coalesced_count_stops_at_the_limit():
    plan = plan_firing(ScheduleTrigger.every(seconds=1), due=NOON, now=NOON + timedelta(hours=1), grace=timedelta(hours=2))
    assert plan.coalesced_count == COALESCED_COUNT_LIMIT
