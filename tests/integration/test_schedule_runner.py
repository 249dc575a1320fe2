"""The trigger loop against the real database: claims, the HTTP enqueue, misfires, coalescing, NOTIFY."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from outboxkit.schedules.definitions import ScheduleTrigger
from tests.support.leadership import wait_until
from tests.support.schedules import FUTURE_TIMEOUT, finish, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EVERY_MINUTE = ScheduleTrigger.every(minutes=1)


# -- HTTP targets: enqueued in the claim's transaction -------------------------------


def test_an_http_occurrence_is_enqueued_once_with_the_request_as_data(schedules, receiver):
    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")
    first, second = schedules.runner(), schedules.runner()

    firing = first.fire_due()

    assert firing.enqueued == [("ping", NOON)]
    [call] = schedules.calls()
    assert (call["schedule_name"], call["scheduled_for"], call["method"], call["url"]) == (
        "ping", NOON, "POST", receiver.url + "/ping",
    )
    assert call["body"] == {"schedule": "ping"} and call["headers"] == {"X-Schedule": "ping"}
    assert call["status"] == "pending"
    [run] = schedules.run_rows("ping")
    assert (run["outcome"], run["counts"]) == ("enqueued", {"outbox_row": call["id"]})
    assert schedules.next_run_at("ping") == NOON + timedelta(minutes=1)
    # The same instant again, from either process: already advanced, nothing more is enqueued.
    assert second.fire_due().enqueued == [] and first.fire_due().enqueued == []
    assert len(schedules.calls()) == 1


def test_a_claim_that_rolls_back_neither_advances_nor_enqueues(schedules, receiver, engine):
    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    with engine.begin() as connection:  # the enqueue fails inside the claim's transaction
        connection.execute(text("ALTER TABLE scheduled_call_outbox RENAME TO scheduled_call_outbox_away"))

    firing = runner.fire_due()

    assert firing.failed == ["ping"] and firing.enqueued == []
    assert schedules.next_run_at("ping") == NOON  # still due
    assert schedules.history("ping") == []  # not even the fence row stayed
    assert finish(firing) == ["ok"]  # a neighbour in the same batch is not held back
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE scheduled_call_outbox_away RENAME TO scheduled_call_outbox"))

    assert runner.fire_due().enqueued == [("ping", NOON)]
    assert len(schedules.calls()) == 1 and schedules.history("ping") == [(NOON, "enqueued")]


def test_the_enqueued_request_is_delivered_by_its_outbox(schedules, receiver, engine, clock):
    from outboxkit import Drainer, HttpTransport
    from outboxkit.transports.guarded import GuardedTransport
    from outboxkit.url_guard import UrlGuard
    from tests.support.models import ScheduledCall
    from tests.support.schedules import LOOPBACK_ALLOWED

    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")
    schedules.runner().fire_due()
    transport = HttpTransport()
    # Its sends are guarded as the kit guards them; the receiver's 127.0.0.1 is allow-listed.
    guard = UrlGuard.from_entries(LOOPBACK_ALLOWED)
    drainer = Drainer(engine, ScheduledCall, transport=transport, clock=clock,
                      guard_transport=lambda inner: GuardedTransport(inner, guard=guard))
    try:
        assert drainer.drain_once().delivered == 1
    finally:
        drainer.close()
        transport.close()
    [request] = receiver.requests
    assert (request.path, request.method, request.body) == ("/ping", "POST", {"schedule": "ping"})
    assert request.headers["X-Schedule"] == "ping"
    assert request.key == str(schedules.calls()[0]["idempotency_key"])


# -- every process fires; occurrences are disjoint ----------------------------------------


def test_two_runners_fire_disjoint_occurrences_without_the_fence_stepping_in(schedules, clock, caplog):
    names = [f"job-{index:02d}" for index in range(12)]
    for name in names:
        schedules.job_schedule(name, EVERY_MINUTE)
    runners = [schedules.runner(batch_size=3), schedules.runner(batch_size=3)]
    caplog.set_level(logging.WARNING, logger="outboxkit.schedules.runner")
    minutes = 5
    for _ in range(minutes):
        start = threading.Barrier(len(runners))
        outcomes: list[str] = []

        def fire(runner, start=start, outcomes=outcomes):
            start.wait()
            outcomes.extend(finish(runner.fire_due()))

        threads = [threading.Thread(target=fire, args=(runner,)) for runner in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes == ["ok"] * len(names)
        clock.advance(minutes=1)

    calls = Counter(schedules.jobs.calls)
    assert max(calls.values()) == 1  # no occurrence ran twice
    assert set(calls) == {(name, NOON + timedelta(minutes=step)) for name in names for step in range(minutes)}
    assert "in the run history already" not in caplog.text  # the claims were disjoint: the fence never had to act


def test_the_fence_stops_an_occurrence_already_in_the_history(schedules, engine, caplog):
    schedules.job_schedule("tick", EVERY_MINUTE)
    with engine.begin() as connection:  # e.g. run by the leader's in-memory scheduler under the same id
        connection.execute(
            text("INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, outcome, leader) "
                 "VALUES ('tick', 'tick', :at, 'ok', 'elsewhere')"),
            {"at": NOON},
        )
    firing = schedules.runner().fire_due()
    assert firing.runs == [] and schedules.jobs.calls == []
    assert "in the run history already" in caplog.text
    assert schedules.next_run_at("tick") == NOON + timedelta(minutes=1)


# -- misfires and coalescing ---------------------------------------------------------------


def test_occurrences_missed_within_the_grace_coalesce_into_one_late_run(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE, misfire_grace_seconds=300)
    clock.advance(minutes=2, seconds=30)  # every process was down for 12:00, 12:01 and 12:02

    firing = schedules.runner().fire_due()

    assert finish(firing) == ["ok"] and firing.missed == []
    assert schedules.jobs.calls == [("tick", NOON + timedelta(minutes=2))]  # once, for the latest
    assert schedules.history("tick") == [(NOON + timedelta(minutes=2), "ok")]
    assert schedules.next_run_at("tick") == NOON + timedelta(minutes=3)


def test_a_late_run_records_how_many_earlier_fire_times_it_covers(schedules, clock, receiver):
    schedules.job_schedule("tick", EVERY_MINUTE)
    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")
    runner = schedules.runner()
    clock.advance(minutes=2, seconds=30)  # 12:00 and 12:01 coalesce into the runs for 12:02

    assert finish(runner.fire_due()) == ["ok"]
    clock.advance(minutes=1)  # on time again: 12:03 covers itself alone
    assert finish(runner.fire_due()) == ["ok"]

    late, on_time = schedules.run_rows("tick")
    assert (late["scheduled_for"], late["counts"]) == (NOON + timedelta(minutes=2), {"calls": 1, "coalesced": 2})
    assert on_time["counts"] == {"calls": 1}
    late, on_time = schedules.run_rows("ping")
    assert late["counts"] == {"outbox_row": schedules.calls()[0]["id"], "coalesced": 2}
    assert on_time["counts"] == {"outbox_row": schedules.calls()[1]["id"]}


def test_occurrences_beyond_the_grace_are_recorded_missed_never_dropped(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE, misfire_grace_seconds=60)
    clock.advance(minutes=10, seconds=30)  # 12:00 ... 12:10 passed; the grace reaches back to 12:09:30

    firing = schedules.runner().fire_due()

    assert finish(firing) == ["ok"]
    assert firing.missed == [("tick", NOON)]
    assert schedules.jobs.calls == [("tick", NOON + timedelta(minutes=10))]
    missed, ran = schedules.run_rows("tick")
    assert (missed["scheduled_for"], missed["outcome"], missed["counts"]) == (NOON, "missed", {"missed": 10})
    assert "12:00:00+00:00 to 2030-01-01T12:09:00+00:00" in missed["error"] and "misfire grace (60 s)" in missed["error"]
    assert (ran["scheduled_for"], ran["outcome"]) == (NOON + timedelta(minutes=10), "ok")


def test_a_daily_occurrence_that_fell_into_a_deploy_runs_late_once(schedules, clock):
    clock.set(datetime(2030, 1, 2, 2, 0, tzinfo=UTC))
    schedules.job_schedule("nightly", ScheduleTrigger.cron(timezone="Europe/Berlin", hour=3, minute=30),
                           misfire_grace_seconds=3600)
    clock.set(datetime(2030, 1, 2, 2, 50, tzinfo=UTC))  # 03:30 Berlin was 02:30 UTC: the deploy took it

    assert finish(schedules.runner().fire_due()) == ["ok"]
    assert schedules.jobs.calls == [("nightly", datetime(2030, 1, 2, 2, 30, tzinfo=UTC))]
    assert schedules.next_run_at("nightly") == datetime(2030, 1, 3, 2, 30, tzinfo=UTC)


def test_a_once_schedule_fires_once_and_is_then_never_due(schedules, clock):
    at = NOON + timedelta(minutes=5)
    schedules.job_schedule("launch", ScheduleTrigger.once(at=at))
    runner = schedules.runner()
    assert runner.fire_due().runs == []
    clock.set(at)
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.next_run_at("launch") is None
    clock.advance(days=1)
    assert runner.fire_due().runs == [] and schedules.jobs.calls == [("launch", at)]


def test_run_now_fires_one_occurrence_at_that_instant_then_the_trigger_resumes(schedules, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    runner = schedules.runner()
    finish(runner.fire_due())  # 12:00
    clock.advance(minutes=20)
    schedules.store.run_now("hourly", actor="alice")

    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.jobs.calls == [("hourly", NOON), ("hourly", NOON + timedelta(minutes=20))]
    assert schedules.next_run_at("hourly") == NOON + timedelta(hours=1)


def test_a_failing_job_is_recorded_as_an_error_and_the_schedule_goes_on(schedules, clock):
    schedules.job_schedule("broken", EVERY_MINUTE, job="failing")
    runner = schedules.runner()
    assert finish(runner.fire_due()) == ["error"]
    [run] = schedules.run_rows("broken")
    assert run["outcome"] == "error" and "RuntimeError: the job failed on purpose" in run["error"]
    assert schedules.leases() == []
    clock.advance(minutes=1)
    assert finish(runner.fire_due()) == ["error"]


# -- the loop ----------------------------------------------------------------------------


def test_the_loop_is_woken_by_a_change_and_fires_it_at_once(schedules, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    clock.advance(minutes=1)
    runner = schedules.runner(max_idle_seconds=3600)  # without NOTIFY it would sleep an hour
    schedules.store.run_now("hourly", actor="test")
    schedules.store.set_enabled("hourly", False, actor="test")
    runner.start()
    assert runner.seconds_until_due() == pytest.approx(3600)
    wait_until(lambda: runner.idle, timeout=30, message="the loop asleep")

    schedules.store.run_now("hourly", actor="alice")  # NOTIFY outboxkit_schedules

    wait_until(lambda: schedules.jobs.calls, timeout=30, message="the run after the edit")
    assert schedules.jobs.calls == [("hourly", NOON + timedelta(minutes=1))]  # the first run now was cancelled
    assert schedules.store.get("hourly").definition.enabled is False


def test_the_loop_sleeps_until_the_nearest_due_row(schedules, clock):
    schedules.job_schedule("hourly", ScheduleTrigger.every(hours=1))
    runner = schedules.runner(max_idle_seconds=3600)
    finish(runner.fire_due())
    clock.advance(minutes=45)
    assert runner.seconds_until_due() == pytest.approx(15 * 60)
    clock.advance(minutes=20)
    assert runner.seconds_until_due() == 0


def test_a_busy_runner_claims_no_more_than_it_can_start_and_leaves_the_rest_to_another(schedules, clock):
    for name in ("a", "b", "c"):
        schedules.job_schedule(name, EVERY_MINUTE, job="blocking")
    busy, other = schedules.runner(max_workers=2), schedules.runner(max_workers=2)

    first = busy.fire_due()

    assert len(first.runs) == 2 and busy.running() == 2
    assert busy.fire_due().runs == []  # full: nothing more is claimed
    assert sorted(schedules.next_run_at(name) for name in ("a", "b", "c")) == [
        NOON, NOON + timedelta(minutes=1), NOON + timedelta(minutes=1),
    ]
    second = other.fire_due()
    assert len(second.runs) == 1
    schedules.jobs.gate.set()
    assert finish(first) + finish(second) == ["ok"] * 3
    assert sorted(name for name, _ in schedules.jobs.calls) == ["a", "b", "c"]


def test_the_trim_keeps_a_run_in_progress_and_its_outcome_is_recorded_when_it_ends(schedules, clock, request):
    first_may_end = threading.Event()
    request.addfinalizer(first_may_end.set)

    def slow_first(context):  # the 12:00 run goes on while later ones start, end and trim the history
        if context.scheduled_for == NOON and not first_may_end.wait(FUTURE_TIMEOUT):
            raise AssertionError("the test never let the first run end")
        return {"calls": 1}

    schedules.job_schedule("overlapping", EVERY_MINUTE, job="blocking", max_running=3)
    runner = schedules.runner(history_limit=2, jobs={**schedules.jobs.functions(), "blocking": slow_first})
    first = runner.fire_due()
    for _ in range(3):
        clock.advance(minutes=1)
        assert finish(runner.fire_due()) == ["ok"]
    assert (NOON, "running") in schedules.history("overlapping")  # the cap counts finished runs only

    first_may_end.set()
    assert finish(first) == ["ok"]
    assert schedules.history("overlapping")[0] == (NOON, "ok")  # recorded, not lost with a trimmed fence
    clock.advance(minutes=1)
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.history("overlapping") == [(NOON + timedelta(minutes=minute), "ok") for minute in (3, 4)]


def test_http_occurrences_are_enqueued_while_every_job_worker_is_busy(schedules, clock, receiver):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    runner = schedules.runner(max_workers=1, lease_seconds=3600)
    started = runner.fire_due()
    assert schedules.jobs.entered.acquire(timeout=30)  # the one worker is busy
    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")

    busy = runner.fire_due()

    assert busy.enqueued == [("ping", NOON)] and busy.runs == []  # an HTTP target is an insert, not a worker's run
    assert runner.seconds_until_due() == pytest.approx(60)  # the loop wakes for the next one, busy or not
    schedules.jobs.gate.set()
    assert finish(started) == ["ok"]


def test_a_run_records_its_outcome_and_trims_the_history_to_the_newest_runs(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner(history_limit=3)
    for _ in range(5):
        assert finish(runner.fire_due()) == ["ok"]
        clock.advance(minutes=1)
    assert schedules.history("tick") == [(NOON + timedelta(minutes=minute), "ok") for minute in (2, 3, 4)]
    assert schedules.leases() == []
