"""A job schedule keeps its cadence at the runner's defaults: every occurrence of an every-1 s job runs.

These tests run on real time (a cadence is a matter of the loop's real sleep), with no other schedule in the
database to wake the loop.  The default run watches a few seconds with one runner and with three; the ``slow``
variants watch a full minute with one worker process and with three.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobContext
from outboxkit.schedules.runner import ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from tests.support.leadership import wait_until
from tests.support.schedules import start_schedule_workers  # noqa: F401  (fixture)

EVERY_SECOND = ScheduleTrigger.every(seconds=1)
SECOND = timedelta(seconds=1)
MINUTE = 60  # occurrences of the every-1 s job the slow variants watch


class Ticks:
    """The every-1 s job: records each fire time it ran for."""

    def __init__(self) -> None:
        self.fire_times: list[datetime] = []
        self._lock = threading.Lock()

    def tick(self, context: JobContext) -> None:
        with self._lock:
            self.fire_times.append(context.scheduled_for)

    def count(self) -> int:
        with self._lock:
            return len(self.fire_times)


@pytest.fixture
def ticks(engine: Engine) -> Ticks:
    ScheduleStore(engine, jobs=["tick"]).create(
        ScheduleDefinition(name="tick", trigger=EVERY_SECOND, target=JobTarget(job="tick")), actor="test"
    )
    return Ticks()


@pytest.fixture
def start_runners(engine: Engine) -> Iterator:
    started: list[ScheduleRunner] = []

    def start(count: int, ticks: Ticks) -> None:
        """``count`` runners at the defaults, each with its own loop, as ``count`` processes would run them."""
        for _ in range(count):
            runner = ScheduleRunner(engine, jobs={"tick": ticks.tick})
            started.append(runner)
            runner.start()

    yield start
    for runner in started:
        runner.stop()


@pytest.mark.parametrize("runners", [1, 3])
def test_an_every_second_job_alone_runs_every_occurrence(engine, ticks, start_runners, runners):
    """Each fire time runs once, or is recorded in the run that covered it; the loop never sleeps past them.

    A loop that slept until its lease's third (10 s) after each claim made every run cover about nine fire
    times.  A host that stalls a thread for a second or two may still make one run cover a fire time, so the
    check is that every fire time is accounted for and that far fewer were covered than ran.
    """
    start_runners(runners, ticks)

    def finished_runs() -> list[tuple[datetime, int]]:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(
                "SELECT scheduled_for, coalesce((counts ->> 'coalesced')::int, 0) FROM outboxkit_job_runs "
                "WHERE job_id = 'tick' AND outcome <> 'running' ORDER BY scheduled_for LIMIT 6"
            ))]  # fmt: skip

    wait_until(lambda: len(finished_runs()) >= 6, timeout=60, message="six runs recorded")
    runs = finished_runs()
    fire_times = [fire_time for fire_time, _ in runs]
    covered = sum(coalesced for _, coalesced in runs[1:])  # what the first run covered came before the window
    assert len(set(fire_times)) == len(fire_times) == 6  # none twice
    assert fire_times[-1] - fire_times[0] == (5 + covered) * SECOND  # every fire time between ran or was covered
    assert covered < 3, f"{covered} fire times coalesced into 5 runs: the loop slept past them"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 3])
def test_an_every_second_job_runs_60_of_60_occurrences_in_a_minute(engine, start_schedule_workers, processes):
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE schedule_worker_runs (name text, scheduled_for timestamptz, holder text)"))
    start_schedule_workers(processes)  # at the runner's defaults, once each is firing
    with engine.connect() as connection:
        first = connection.execute(text("SELECT date_trunc('second', clock_timestamp()) + interval '2 seconds'")).scalar_one()
    ScheduleStore(engine, jobs=["record"]).create(
        ScheduleDefinition(name="tick", trigger=EVERY_SECOND, target=JobTarget(job="record")), actor="test"
    )
    last = first + (MINUTE - 1) * SECOND

    def ran(moment: datetime) -> bool:
        with engine.connect() as connection:
            return bool(connection.execute(
                text("SELECT count(*) FROM schedule_worker_runs WHERE scheduled_for >= :moment"), {"moment": moment}
            ).scalar_one())

    wait_until(lambda: ran(last), timeout=3 * MINUTE, message="the minute's last occurrence")
    with engine.connect() as connection:
        fire_times = connection.execute(
            text("SELECT scheduled_for FROM schedule_worker_runs WHERE scheduled_for BETWEEN :first AND :last "
                 "ORDER BY scheduled_for"), {"first": first, "last": last}
        ).scalars().all()  # fmt: skip
        holders = connection.execute(text("SELECT count(DISTINCT holder) FROM schedule_worker_runs")).scalar_one()
    assert fire_times == [first + step * SECOND for step in range(MINUTE)]  # 60 of 60, none twice
    assert 1 <= holders <= processes
