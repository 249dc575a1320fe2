"""The fence outlives the capped run history: an occurrence whose run was trimmed never runs again.

A late process (a scheduler that lost its lock and fires a stale occurrence,
a runner that claimed it and stalled) may still hold an occurrence after the
history was trimmed past it: the history row that fenced it is gone, and the
job's fence mark (``outboxkit_job_fences``) must refuse it instead.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, create_engine, event, text

from outboxkit import ManualClock
from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobRunner, ScheduledJob, every
from outboxkit.schedules.runner import ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from tests.support.database import sqlalchemy_url
from tests.support.schedules import FUTURE_TIMEOUT, JobCalls

CAP = 10
START = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def history(engine: Engine, job_id: str) -> list[datetime]:
    with engine.connect() as connection:
        return list(connection.scalars(
            text("SELECT scheduled_for FROM outboxkit_job_runs WHERE job_id = :job ORDER BY scheduled_for"),
            {"job": job_id},
        ))


def test_an_elected_jobs_trimmed_occurrence_is_refused_to_a_late_scheduler(engine):
    calls: list[datetime] = []
    job = ScheduledJob(
        id="test.tick", name="tick", trigger=every(minutes=1), function=lambda context: calls.append(context.scheduled_for)
    )
    current = JobRunner(engine, leader=lambda: "new-leader", history_limit=CAP)
    late = JobRunner(engine, leader=lambda: "old-leader", history_limit=CAP)
    first = START
    assert current.run(job, scheduled_for=first).outcome == "ok"
    for minute in range(1, CAP + 1):  # the history holds CAP runs: the first is trimmed
        current.run(job, scheduled_for=first + timedelta(minutes=minute))
    assert first not in history(engine, "test.tick") and len(history(engine, "test.tick")) == CAP
    assert late.run(job, scheduled_for=first).outcome == "skipped"  # a stale occurrence of a scheduler that lost its lock
    assert calls.count(first) == 1


def test_a_schedules_trimmed_occurrence_is_refused_to_a_runner_that_still_holds_it(engine):
    calls = JobCalls()
    clock = ManualClock(START)
    store = ScheduleStore(engine, jobs=calls.functions(), clock=clock)
    store.create(
        ScheduleDefinition(name="tick", trigger=ScheduleTrigger.every(minutes=1), target=JobTarget(job="record")),
        actor="test",
    )
    current = ScheduleRunner(engine, jobs=calls.functions(), clock=clock, history_limit=CAP)
    late = ScheduleRunner(engine, jobs=calls.functions(), clock=clock, history_limit=CAP)
    try:
        first = START + timedelta(minutes=1)
        assert current.run_job("tick", scheduled_for=first).outcome == "ok"
        for minute in range(2, CAP + 2):
            clock.set(START + timedelta(minutes=minute))
            current.run_pending()
        assert first not in history(engine, "tick") and len(history(engine, "tick")) == CAP
        assert late.run_job("tick", scheduled_for=first).outcome == "skipped"
        kept = history(engine, "tick")[0]
        assert late.run_job("tick", scheduled_for=kept).outcome == "skipped"  # in the history: fenced by its row
        assert late.run_job("tick", scheduled_for=kept + timedelta(seconds=30)).outcome == "ok"  # a new one runs
    finally:
        current.stop()
        late.stop()
    assert [moment for _, moment in calls.calls].count(first) == 1


class FreezeAtCommit:
    """Freezes the ``nth`` transaction of an engine that touched a fence, at its commit, until released: a process
    stopped (SIGSTOP, a paused VM) inside that transaction, its statements run and its commit not yet sent."""

    def __init__(self, engine: Engine, nth: int) -> None:
        self.fenced = 0
        self.touched = False
        self.nth = nth
        self.frozen = threading.Event()
        self.release = threading.Event()
        event.listen(engine, "before_cursor_execute", self._on_statement)
        event.listen(engine, "commit", self._on_commit)

    def _on_statement(self, connection: object, cursor: object, statement: str, *args: object) -> None:
        self.touched = self.touched or "outboxkit_job_fences" in statement

    def _on_commit(self, connection: object) -> None:
        touched, self.touched = self.touched, False
        if touched:
            self.fenced += 1
            if self.fenced == self.nth:
                self.frozen.set()
                self.release.wait(FUTURE_TIMEOUT * 2)  # longer than the test waits for the other runner


@pytest.mark.parametrize("frozen_in", ["take", "record"])
def test_a_runner_frozen_inside_a_fence_transaction_does_not_stop_the_next_occurrence(
    engine: Engine, database_url: str, frozen_in: str
) -> None:
    calls: list[datetime] = []
    job = ScheduledJob(
        id="test.tick", name="tick", trigger=every(minutes=1), function=lambda context: calls.append(context.scheduled_for)
    )
    frozen_engine = create_engine(sqlalchemy_url(database_url), pool_size=2)
    freeze = FreezeAtCommit(frozen_engine, nth=1 if frozen_in == "take" else 2)
    frozen = JobRunner(frozen_engine, leader=lambda: "frozen", history_limit=CAP)
    current = JobRunner(engine, leader=lambda: "current", history_limit=CAP)
    with ThreadPoolExecutor(max_workers=2) as pool:
        try:
            stalled = pool.submit(frozen.run, job, scheduled_for=START)
            assert freeze.frozen.wait(FUTURE_TIMEOUT), "the frozen runner never reached its commit"
            # The server ends the frozen session after a few idle seconds, and the next occurrence runs.
            nxt = pool.submit(current.run, job, scheduled_for=START + timedelta(minutes=1))
            assert nxt.result(timeout=FUTURE_TIMEOUT).outcome == "ok"
        finally:
            freeze.release.set()
        assert stalled.result(timeout=FUTURE_TIMEOUT).outcome == "error"  # its session was ended under it
    frozen_engine.dispose()
    assert START + timedelta(minutes=1) in calls
    assert calls.count(START) == (1 if frozen_in == "record" else 0)


def test_a_schedule_runner_frozen_while_it_fires_does_not_stop_a_run_now(engine: Engine, database_url: str) -> None:
    calls = JobCalls()
    clock = ManualClock(START)
    store = ScheduleStore(engine, jobs=calls.functions(), clock=clock)
    store.create(
        ScheduleDefinition(name="tick", trigger=ScheduleTrigger.every(minutes=1), target=JobTarget(job="record")),
        actor="test",
    )
    frozen_engine = create_engine(sqlalchemy_url(database_url), pool_size=2)
    frozen = ScheduleRunner(frozen_engine, jobs=calls.functions(), clock=clock, history_limit=CAP)
    current = ScheduleRunner(engine, jobs=calls.functions(), clock=clock, history_limit=CAP)
    clock.set(START + timedelta(minutes=1))
    freeze = FreezeAtCommit(frozen_engine, nth=1)  # its claim: the schedule row and its fence taken
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            pool.submit(frozen.run_pending)
            assert freeze.frozen.wait(FUTURE_TIMEOUT), "the frozen runner never reached its commit"
            other = START + timedelta(minutes=1, seconds=30)
            assert current.run_job("tick", scheduled_for=other).outcome == "ok"
        finally:
            freeze.release.set()
            frozen.stop()
            current.stop()
    frozen_engine.dispose()
    assert other in [moment for _, moment in calls.calls]
