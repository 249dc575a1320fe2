"""Schedule stores and runners on one test database and the test's ManualClock.

``ScheduleHarness`` builds them with the jobs below registered and the
``ScheduledCall`` outbox known, stops every runner it made after the test,
and reads back what happened (run history, enqueued calls).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from outboxkit import ManualClock
from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobContext
from outboxkit.schedules.runner import Firing, ScheduleRunner
from outboxkit.schedules.store import ScheduleStore
from outboxkit.storage.tables import job_runs, schedule_leases
from outboxkit.url_guard import UrlGuard
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent, ScheduledCall

FUTURE_TIMEOUT = 30.0  # seconds; the machine is busy
# The receivers of the tests listen on 127.0.0.1, which the URL guard lets through only when allow-listed.
LOOPBACK_ALLOWED = ("127.0.0.1/32",)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class JobCalls:
    """What the registered test jobs did: every call, and a gate the ``blocking`` job waits on."""

    calls: list[tuple[str, datetime]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def record(self, context: JobContext) -> dict[str, int]:
        with self.lock:
            self.calls.append((context.job_id, context.scheduled_for))
        return {"calls": 1}

    def blocking(self, context: JobContext) -> dict[str, int]:
        self.record(context)
        self.entered.release()
        if not self.gate.wait(FUTURE_TIMEOUT):
            raise AssertionError("the test never opened the gate")
        return {"calls": 1}

    def failing(self, context: JobContext) -> None:
        self.record(context)
        raise RuntimeError("the job failed on purpose")

    def functions(self) -> dict[str, Callable[[JobContext], Any]]:
        return {"record": self.record, "blocking": self.blocking, "failing": self.failing}


class ScheduleHarness:
    def __init__(self, engine: Engine, clock: ManualClock) -> None:
        self.engine = engine
        self.clock = clock
        self.jobs = JobCalls()
        self.store = ScheduleStore(
            engine, clock=clock, jobs=self.jobs.functions(), outboxes=[SampleEvent, ScheduledCall],
            url_guard=UrlGuard.from_entries(LOOPBACK_ALLOWED),
        )
        self.runners: list[ScheduleRunner] = []

    def runner(self, **overrides: Any) -> ScheduleRunner:
        options: dict[str, Any] = {"jobs": self.jobs.functions(), "outboxes": [SampleEvent, ScheduledCall], "clock": self.clock}
        runner = ScheduleRunner(self.engine, **{**options, **overrides})
        self.runners.append(runner)
        return runner

    def close(self) -> None:
        self.jobs.gate.set()
        for runner in self.runners:
            runner.stop(wait=True)

    # -- definitions -----------------------------------------------------------

    def job_schedule(self, name: str, trigger: ScheduleTrigger, *, job: str = "record", **options: Any) -> None:
        self.store.create(ScheduleDefinition(name=name, trigger=trigger, target=JobTarget(job=job), **options), actor="test")

    def http_schedule(self, name: str, trigger: ScheduleTrigger, url: str, **options: Any) -> None:
        target = HttpTarget(url=url, outbox="scheduled-calls", body={"schedule": name}, headers={"X-Schedule": name})
        self.store.create(ScheduleDefinition(name=name, trigger=trigger, target=target, **options), actor="test")

    # -- reading back ------------------------------------------------------------

    def history(self, name: str) -> list[tuple[datetime, str]]:
        """(scheduled_for, outcome) of every recorded occurrence of ``name``, oldest first."""
        statement = select(job_runs.c.scheduled_for, job_runs.c.outcome).where(job_runs.c.job_id == name)
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(statement.order_by(job_runs.c.scheduled_for))]  # type: ignore[misc]

    def run_rows(self, name: str) -> list[Any]:
        statement = select(job_runs).where(job_runs.c.job_id == name).order_by(job_runs.c.scheduled_for)
        with self.engine.connect() as connection:
            return list(connection.execute(statement).mappings())

    def calls(self) -> list[Any]:
        """Every ScheduledCall row, oldest first."""
        with self.engine.connect() as connection:
            return list(connection.execute(select(ScheduledCall.__table__).order_by(text("id"))).mappings())

    def leases(self) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(select(schedule_leases)).mappings())

    def next_run_at(self, name: str) -> datetime | None:
        return self.store.get(name).next_run_at


def finish(firing: Firing) -> list[str]:
    """Wait for the runs a step started; their outcomes."""
    return [future.result(timeout=FUTURE_TIMEOUT).outcome for future in firing.runs]


@pytest.fixture
def schedules(engine: Engine, clock: ManualClock) -> Iterator[ScheduleHarness]:
    """A ``ScheduleHarness`` on the test's database and clock; its runners are stopped after the test."""
    harness = ScheduleHarness(engine, clock)
    yield harness
    harness.close()


@pytest.fixture
def start_schedule_workers(database_url: str) -> Iterator[Callable[..., list[subprocess.Popen[str]]]]:
    """Start ``tests.support.schedule_worker`` processes on the test's database; they are killed after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(count: int = 1, *, lease_seconds: float | None = None) -> list[subprocess.Popen[str]]:
        """``count`` processes started together (``lease_seconds`` None: the runner's defaults), once each is ready."""
        command = [sys.executable, "-m", "tests.support.schedule_worker", sqlalchemy_url(database_url)]
        if lease_seconds is not None:
            command.append(str(lease_seconds))
        processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        started.extend(processes)
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return processes

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
