"""Schedule rows fired by real processes that are SIGKILLed: a dead holder's lease expires and frees its slot."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from sqlalchemy import text

from outboxkit.schedules.claims import Firing
from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobContext
from outboxkit.schedules.runner import ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from tests.support.leadership import wait_until
from tests.support.schedules import start_schedule_workers  # noqa: F401  (fixture)

LEASE_SECONDS = 2.0


@pytest.fixture
def start_worker(start_schedule_workers: Callable[..., list[subprocess.Popen[str]]]) -> Callable:
    """``count`` worker processes with a short lease, started together; returns once each has said it is ready."""
    return lambda count=1: start_schedule_workers(count, lease_seconds=LEASE_SECONDS)


def survivor_jobs(calls: list) -> dict:
    def slow(context: JobContext) -> dict[str, int]:  # the same job, in the process that survives
        calls.append(context.scheduled_for)
        return {"survived": 1}

    return {"slow": slow}


@pytest.mark.parametrize("rerun", [False, True], ids=["stays abandoned", "re-run once"])
def test_a_killed_holder_frees_its_slot_when_its_lease_expires(engine, start_worker, rerun):
    store = ScheduleStore(engine, jobs=["slow"])
    store.create(ScheduleDefinition(name="slow", trigger=ScheduleTrigger.every(hours=1), target=JobTarget(job="slow"),
                                    rerun_if_abandoned=rerun, misfire_grace_seconds=86400), actor="test")
    store.run_now("slow", actor="test")
    (worker,) = start_worker()
    line = worker.stdout.readline().strip()
    assert line.startswith("started ")
    worker.kill()  # SIGKILL mid-run: nothing renews its lease any more
    worker.wait(timeout=30)

    calls: list = []
    survivor = ScheduleRunner(engine, jobs=survivor_jobs(calls), lease_seconds=LEASE_SECONDS)
    swept = Firing()

    def sweep() -> bool:
        swept.extend(survivor.sweep_expired_leases())
        return bool(swept.abandoned)

    try:
        wait_until(sweep, timeout=60, message="the dead holder's lease swept")
        outcomes = [run.result(timeout=60).outcome for run in swept.runs]
    finally:
        survivor.stop()
    with engine.connect() as connection:
        outcome, error = connection.execute(text("SELECT outcome, error FROM outboxkit_job_runs WHERE job_id = 'slow'")).one()
        leases = connection.execute(text("SELECT count(*) FROM outboxkit_schedule_leases")).scalar_one()
    assert swept.abandoned == [("slow", swept.abandoned[0][1])] and leases == 0
    if rerun:
        assert outcomes == ["ok"] and outcome == "ok" and len(calls) == 1 and "re-run once" in error
    else:
        assert outcomes == [] and outcome == "abandoned" and calls == [] and "expired at" in error


def test_three_processes_killed_in_turn_run_no_occurrence_twice(engine, start_worker):
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE schedule_worker_runs (name text, scheduled_for timestamptz, holder text)"))
    store = ScheduleStore(engine, jobs=["record"])
    store.create(ScheduleDefinition(name="tick", trigger=ScheduleTrigger.every(seconds=1), target=JobTarget(job="record"),
                                    misfire_grace_seconds=60), actor="test")
    workers = start_worker(3)

    def runs() -> int:
        with engine.connect() as connection:
            return connection.execute(text("SELECT count(DISTINCT scheduled_for) FROM schedule_worker_runs")).scalar_one()

    for turn in range(3):  # kill one process after two more occurrences, start a new one
        target = runs() + 2
        wait_until(lambda target=target: runs() >= target, timeout=60, message="more occurrences")
        workers[turn].kill()
        workers[turn].wait(timeout=30)
        (workers[turn],) = start_worker()
    target = runs() + 2
    wait_until(lambda: runs() >= target, timeout=60, message="occurrences after the last kill")
    for worker in workers:
        worker.kill()
        worker.wait(timeout=30)
    with engine.connect() as connection:
        total, distinct = connection.execute(
            text("SELECT count(*), count(DISTINCT scheduled_for) FROM schedule_worker_runs")
        ).one()
        holders = connection.execute(text("SELECT count(DISTINCT holder) FROM schedule_worker_runs")).scalar_one()
    assert total == distinct  # no occurrence ran twice, whichever process was killed
    assert holders >= 2  # the occurrences were fired by more than one process
