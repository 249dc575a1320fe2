"""Driving schedules from a user's tests: ``run_pending`` with a ManualClock, ``run_job``, a stopped runner restarting."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.errors import UnknownScheduleError
from outboxkit.schedules.definitions import HttpTarget, ScheduleTrigger
from outboxkit.schedules.jobs import JobContext
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent, ScheduledCall
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


# -- the kit's own loop, driven by hand (docs/testing.md, "Schedules") ---------------------------


def hand_driven_kit(engine, clock) -> OutboxKit:
    """A kit as the pytest plugin's fixture builds it: no loop of its own, the test's ManualClock."""
    settings = OutboxKitSettings(
        drain_enabled=False, scheduler_enabled=False, schedules_enabled=False, url_allow_list=("127.0.0.1/32",)
    )
    return OutboxKit(engine, [SampleEvent, ScheduledCall], settings=settings, clock=clock)


def expire_carts(context: JobContext) -> dict[str, int]:
    return {"expired": 0}


def test_the_kits_declared_schedules_fire_when_the_test_moves_the_clock(engine, clock):
    kit = hand_driven_kit(engine, clock)
    kit.schedules.add_job("shop.expire-carts", expire_carts, ScheduleTrigger.cron(timezone="UTC", hour=3))
    clock.set(datetime(2030, 1, 1, 1, 0, tzinfo=UTC))
    try:
        assert kit.schedules.run_pending().runs == []  # 01:00: synced, nothing due
        clock.advance(hours=2)
        firing = kit.schedules.run_pending()
        assert [run.result().outcome for run in firing.runs] == ["ok"]
        assert kit.schedules.run_job("shop.expire-carts").outcome == "skipped"  # 03:00 ran already: the fence
        clock.advance(minutes=10)
        record = kit.schedules.run_job("shop.expire-carts")  # one occurrence at 03:10, in this thread
        assert (record.outcome, record.counts) == ("ok", {"expired": 0})
        assert not kit.schedules.running  # driven by hand: no loop thread
    finally:
        kit.close()
    three = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)
    assert kit.schedules.store.get("shop.expire-carts").next_run_at == three + timedelta(days=1)


def test_a_schedule_declared_after_a_hand_run_is_synced_by_the_next_one(engine, clock, receiver):
    kit = hand_driven_kit(engine, clock)
    kit.schedules.add_job("shop.expire-carts", expire_carts, ScheduleTrigger.every(hours=1))
    try:
        assert [run.result().outcome for run in kit.schedules.run_pending().runs] == ["ok"]
        kit.schedules.add_http("partner.ping", ScheduleTrigger.every(hours=1),
                               HttpTarget(url=receiver.url + "/ping", outbox="scheduled-calls"))
        firing = kit.schedules.run_pending()
        assert firing.enqueued == [("partner.ping", NOON)]
        assert kit.schedules.run_job("partner.ping", scheduled_for=NOON + timedelta(minutes=1)).outcome == "enqueued"
    finally:
        kit.close()
