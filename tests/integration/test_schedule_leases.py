"""Running-instances limit across processes: lease rows, their renewal, expiry, abandonment and the one re-run."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from outboxkit.schedules import leases as schedule_leases
from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.schedules.runner import Firing, ScheduleRunner
from tests.support.schedules import FUTURE_TIMEOUT, ScheduleHarness, finish, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EVERY_MINUTE = ScheduleTrigger.every(minutes=1)


def entered(schedules: ScheduleHarness, count: int = 1) -> None:
    """Wait until the blocking job has started ``count`` more runs."""
    for _ in range(count):
        assert schedules.jobs.entered.acquire(timeout=FUTURE_TIMEOUT), "the blocking job did not start"


def test_a_lease_keeps_a_job_from_overlapping_itself_across_two_runners(schedules, clock):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    first, second = schedules.runner(), schedules.runner()
    started = first.fire_due()
    entered(schedules)
    [lease] = schedules.leases()
    assert (lease["holder"], lease["scheduled_for"], lease["attempt"]) == (first.holder, NOON, 1)

    clock.advance(minutes=1)  # 12:01 is due while 12:00 still runs in the other process
    assert first.renew_leases() == 1  # as its loop does
    blocked = second.fire_due()

    assert blocked.runs == [] and blocked.missed == []  # it waits for the slot, due and unclaimed
    assert schedules.next_run_at("slow") == NOON + timedelta(minutes=1)
    assert second.seconds_until_due() > 0  # a waiting row does not keep the loop spinning
    schedules.jobs.gate.set()
    assert finish(started) == ["ok"]
    assert schedules.leases() == []
    assert finish(second.fire_due()) == ["ok"]  # the slot is free: the waiting occurrence runs, late
    assert schedules.history("slow") == [(NOON, "ok"), (NOON + timedelta(minutes=1), "ok")]
    assert [at for _, at in schedules.jobs.calls] == [NOON, NOON + timedelta(minutes=1)]


def test_occurrences_that_waited_for_a_slot_coalesce_and_beyond_the_grace_are_missed(schedules, clock):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking", misfire_grace_seconds=150)
    runner = schedules.runner(lease_seconds=3600)
    started = runner.fire_due()
    entered(schedules)
    clock.advance(minutes=5)  # 12:01 to 12:05 fall while 12:00 still runs
    assert runner.fire_due().runs == []
    schedules.jobs.gate.set()
    assert finish(started) == ["ok"]

    assert finish(runner.fire_due()) == ["ok"]

    assert schedules.history("slow") == [
        (NOON, "ok"), (NOON + timedelta(minutes=1), "missed"), (NOON + timedelta(minutes=5), "ok"),
    ]
    [missed] = [row for row in schedules.run_rows("slow") if row["outcome"] == "missed"]
    assert missed["counts"] == {"missed": 2}  # 12:01 and 12:02; 12:03 and 12:04 coalesced into the 12:05 run
    assert schedules.run_rows("slow")[-1]["counts"] == {"calls": 1, "coalesced": 2}  # recorded on that run


def test_max_running_two_lets_two_runs_overlap_and_no_third(schedules, clock):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking", max_running=2)
    first, second = schedules.runner(), schedules.runner()
    runs = first.fire_due().runs
    clock.advance(minutes=1)
    first.renew_leases()
    runs += second.fire_due().runs
    entered(schedules, 2)
    clock.advance(minutes=1)
    assert first.renew_leases() + second.renew_leases() == 2
    third = first.fire_due()
    assert third.runs == [] and third.missed == []
    assert len(schedules.leases()) == 2
    schedules.jobs.gate.set()
    assert [future.result(timeout=FUTURE_TIMEOUT).outcome for future in runs] == ["ok", "ok"]
    assert finish(first.fire_due()) == ["ok"]
    assert [at for at, _ in schedules.history("slow")] == [NOON + timedelta(minutes=minute) for minute in range(3)]


def test_a_held_lease_is_renewed_and_not_swept(schedules, clock):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    holder, other = schedules.runner(lease_seconds=30), schedules.runner(lease_seconds=30)
    started = holder.fire_due()
    entered(schedules)
    for _ in range(4):  # two minutes, renewed every 20 s
        clock.advance(seconds=20)
        assert holder.renew_leases() == 1
        assert other.sweep_expired_leases().abandoned == []
    [lease] = schedules.leases()
    assert lease["expires_at"] == clock.now() + timedelta(seconds=30)
    schedules.jobs.gate.set()
    assert finish(started) == ["ok"]


def test_an_expired_lease_frees_the_slot_and_the_run_is_abandoned(schedules, clock):
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    dead, alive = schedules.runner(lease_seconds=30), schedules.runner(lease_seconds=30)
    started = dead.fire_due()  # this process stops renewing: it is as good as dead
    entered(schedules)
    clock.advance(seconds=31)

    swept = alive.sweep_expired_leases()

    assert swept.abandoned == [("slow", NOON)] and swept.runs == []
    assert schedules.leases() == []
    [run] = schedules.run_rows("slow")
    assert run["outcome"] == "abandoned" and f"held by {dead.holder}, expired" in run["error"]
    assert f"marked abandoned by {alive.holder}" in run["error"]
    clock.set(NOON + timedelta(minutes=1))
    later = alive.fire_due()  # the slot is free again
    entered(schedules)
    schedules.jobs.gate.set()
    assert finish(later) == ["ok"]
    # The stalled run returns at last: nothing re-ran its occurrence, so its real outcome is recorded.
    assert finish(started) == ["ok"]
    assert schedules.history("slow") == [(NOON, "ok"), (NOON + timedelta(minutes=1), "ok")]


def kill_mid_run(schedules: ScheduleHarness, clock, *, grace: int) -> tuple[Firing, ScheduleRunner]:
    """bench/schedules.py's kill run in one step: a schedule every 2 s under a 6 s lease, its holder dies mid-run;
    returns the dead holder's run and the process left alive, the clock at 12:00:07, the lease expired."""
    schedules.job_schedule("tick", ScheduleTrigger.every(seconds=2), job="blocking", misfire_grace_seconds=grace)
    dead, alive = schedules.runner(lease_seconds=6), schedules.runner(lease_seconds=6)
    started = dead.fire_due()  # the 12:00:00 run; its process is SIGKILLed now and never renews
    entered(schedules)
    clock.advance(seconds=5)  # 12:00:02 and 12:00:04 fall due while the dead holder's lease holds the slot
    waiting = alive.fire_due()
    assert waiting.runs == [] and waiting.missed == []
    clock.advance(seconds=2)  # 12:00:06 falls due; the lease expired at 12:00:06
    return started, alive


def test_a_holder_killed_mid_run_abandons_that_run_and_its_waiting_occurrences_run_once_within_the_grace(
    schedules, clock
):
    started, alive = kill_mid_run(schedules, clock, grace=300)

    swept = alive.sweep_expired_leases()
    assert swept.abandoned == [("tick", NOON)] and swept.runs == []  # at most once: not run again
    later = alive.fire_due()
    entered(schedules)

    assert later.missed == [] and len(later.runs) == 1  # 12:00:02 to 12:00:06 coalesce into one run
    assert schedules.history("tick") == [(NOON, "abandoned"), (NOON + timedelta(seconds=6), "running")]
    schedules.jobs.gate.set()
    assert finish(later) == ["ok"]
    assert schedules.run_rows("tick")[-1]["counts"] == {"calls": 1, "coalesced": 2}
    finish(started)  # the "killed" thread ends (a real kill would leave the run abandoned)


def test_a_holder_killed_mid_run_for_longer_than_the_grace_leaves_a_missed_record_beyond_the_grace(schedules, clock):
    started, alive = kill_mid_run(schedules, clock, grace=3)

    alive.sweep_expired_leases()
    later = alive.fire_due()
    entered(schedules)

    assert later.missed == [("tick", NOON + timedelta(seconds=2))]  # 5 s late when claimed, beyond the 3 s grace
    [missed] = [row for row in schedules.run_rows("tick") if row["outcome"] == "missed"]
    assert missed["counts"] == {"missed": 1} and "more than their misfire grace (3 s) late" in missed["error"]
    assert schedules.history("tick") == [
        (NOON, "abandoned"), (NOON + timedelta(seconds=2), "missed"), (NOON + timedelta(seconds=6), "running"),
    ]  # 12:00:04 (3 s late) coalesced into the 12:00:06 run
    schedules.jobs.gate.set()
    assert finish(later) == ["ok"]
    finish(started)


def test_an_abandoned_run_of_a_job_safe_to_rerun_runs_once_more_then_stays_abandoned(schedules, clock):
    schedules.job_schedule("slow", ScheduleTrigger.every(hours=1), job="blocking", rerun_if_abandoned=True)
    first, second, third = (schedules.runner(lease_seconds=30) for _ in range(3))
    stalled = first.fire_due()
    entered(schedules)
    clock.advance(seconds=31)

    rerun = second.sweep_expired_leases()  # re-run once, by the process that found it

    assert rerun.abandoned == [("slow", NOON)] and len(rerun.runs) == 1
    entered(schedules)
    [lease] = schedules.leases()
    assert (lease["holder"], lease["attempt"], lease["scheduled_for"]) == (second.holder, 2, NOON)
    [run] = schedules.run_rows("slow")
    assert run["outcome"] == "running" and run["leader"] == second.holder and "re-run once" in run["error"]

    clock.advance(seconds=31)  # the re-run's process stalls too: this time the run stays abandoned
    final = third.sweep_expired_leases()
    assert final.abandoned == [("slow", NOON)] and final.runs == []
    assert schedules.run_rows("slow")[0]["outcome"] == "abandoned"

    schedules.jobs.gate.set()
    assert finish(stalled) == ["ok"] and finish(rerun) == ["ok"]
    assert schedules.jobs.calls == [("slow", NOON), ("slow", NOON)]  # two runs of one occurrence, no third
    # The first run came back after the re-run had taken the occurrence over: the re-run's record stands.
    [run] = schedules.run_rows("slow")
    assert run["outcome"] == "ok" and "re-run once" in run["error"]


def test_a_claim_that_read_the_leases_before_a_rerun_committed_starts_no_second_run(schedules, clock, engine):
    """The sweep re-runs an abandoned run under the schedule row's lock and commits; a claim whose statement read
    the leases before that commit, and locked the row after it, must not start a second run past max_running=1.

    The test commits the re-run's lease between the claim's read and its write.  The lease's foreign key would
    make that insert wait for the row lock the claim holds (in the race the sweep held it first and released it
    at its commit), so this database goes without it."""
    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    runner = schedules.runner()
    with engine.begin() as connection:
        [foreign_key] = connection.execute(text(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'outboxkit_schedule_leases'::regclass AND contype = 'f'"
        )).scalars()
        connection.execute(text(f"ALTER TABLE outboxkit_schedule_leases DROP CONSTRAINT {foreign_key}"))
    with engine.begin() as claim:
        [row] = runner.claims.due(claim, now=NOON, skip=[], limit=1, kind="job")  # no live lease in its snapshot
        with engine.begin() as sweep:  # the sweep's re-run of an abandoned 11:59 run commits meanwhile
            schedule_leases.take(
                sweep, schedule_id=row["id"], schedule_name="slow", job="blocking", run_id=0,
                scheduled_for=NOON - timedelta(minutes=1), holder="the sweeper", now=NOON, seconds=30, attempt=2,
            )
        firing = Firing()
        grant = runner.claims.fire(claim, row, now=NOON, firing=firing)

    assert grant is None and firing.missed == []
    assert [lease["holder"] for lease in schedules.leases()] == ["the sweeper"]
    assert schedules.next_run_at("slow") == NOON and schedules.history("slow") == []  # due: it waits for the slot


def test_a_run_that_ends_releases_its_lease_in_the_transaction_that_records_it(schedules):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.leases() == [] and runner.running() == 0
    [run] = schedules.run_rows("tick")
    assert (run["outcome"], run["counts"], run["leader"]) == ("ok", {"calls": 1}, runner.holder)
    assert run["finished_at"] is not None


def test_a_run_records_its_outcome_after_the_database_dropped_every_connection(schedules, clock, engine, database_url):
    import psycopg

    schedules.job_schedule("slow", EVERY_MINUTE, job="blocking")
    runner = schedules.runner()
    started = runner.fire_due()
    entered(schedules)
    with psycopg.connect(database_url, autocommit=True) as admin:  # as a restart would: the pool's connections die
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
    schedules.jobs.gate.set()
    assert finish(started) == ["ok"]
    assert schedules.history("slow") == [(NOON, "ok")] and schedules.leases() == []
