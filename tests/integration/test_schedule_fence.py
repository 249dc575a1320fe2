"""The fence outlives the capped run history: an occurrence whose run was trimmed never runs again.

A late process (a scheduler that lost its lock and fires a stale occurrence,
a runner that claimed it and stalled) may still hold an occurrence after the
history was trimmed past it: the history row that fenced it is gone, and the
job's fence mark (``outboxkit_job_fences``) must refuse it instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, text

from outboxkit import ManualClock
from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobRunner, ScheduledJob, every
from outboxkit.schedules.runner import ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from tests.support.schedules import JobCalls

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
