"""A process that fires schedule rows, for the schedule fault scenarios.

::

    python -m tests.faults.schedule_worker --database-url postgresql+psycopg://... --name schedules-1

It runs one ``ScheduleRunner`` with the job ``record``: each run inserts its
occurrence into ``fault_schedule_runs`` (no unique constraint: a second run
of one occurrence would show) with the database's ``clock_timestamp()`` as
its start, waits ``--job-seconds`` (``--slow-seconds`` for a schedule named
``slow-*``) and stamps its end.  Its pooled sessions
are named ``fault-schedules:<name>`` and its LISTEN session
``outboxkit-schedules:<name>:<pid>``, so a scenario can terminate every
session of one process.  ``--max-workers`` caps the runs it holds at once,
so it claims no more than that at a fire time and leaves the rest due to
the other processes (a scenario that needs every process to fire soon after
a fault caps them; otherwise the first one awake takes every due row).

The runner's clock is the system clock plus an offset: with ``--step-signals``
SIGUSR1 steps it one hour forward and SIGUSR2 one hour back, as a host whose
clock jumped.  Stdout carries one JSON object per line: ``ready``,
``stepped`` (``offset_seconds``), ``log`` for each of the runner's warnings
(``event_name``, ``message``) and ``stopped``.  SIGTERM stops the runner,
waiting for its runs to record their outcome.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import Column, DateTime, Engine, Identity, Integer, MetaData, Table, Text, create_engine, func, insert, update

from outboxkit.schedules.jobs import JobContext
from outboxkit.schedules.runner import ScheduleRunner
from tests.support.clocks import OffsetClock

__all__ = ["install_runs_table", "runs_table", "schedule_worker_command"]

STEP = timedelta(hours=1)

runs_metadata = MetaData()
runs_table = Table(
    "fault_schedule_runs",
    runs_metadata,
    Column("id", Integer, Identity(), primary_key=True),
    Column("name", Text, nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("holder", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
    Column("finished_at", DateTime(timezone=True)),
)


def install_runs_table(engine: Engine) -> None:
    runs_metadata.create_all(engine)


def schedule_worker_command(
    database_url: str, *, lease: float, job_seconds: float, slow_seconds: float = 0.0,
    stepped: frozenset[str] = frozenset(), max_workers: int | Mapping[str, int] = 16,
) -> Callable[[str], list[str]]:
    """The ``WorkerFleet`` command factory for this module; the names in ``stepped`` take the step signals.

    ``max_workers``: every process's cap, or a cap per name (16 for a name it leaves out).
    """

    def command(name: str) -> list[str]:
        cap = max_workers if isinstance(max_workers, int) else max_workers.get(name, 16)
        arguments = [sys.executable, "-m", "tests.faults.schedule_worker", "--database-url", database_url,
                     "--name", name, "--lease", str(lease), "--job-seconds", str(job_seconds),
                     "--slow-seconds", str(slow_seconds), "--max-workers", str(cap)]  # fmt: skip
        return arguments + (["--step-signals"] if name in stepped else [])

    return command


_printing = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _printing:
        print(json.dumps({"event": event, "pid": os.getpid(), "at": time.time(), **fields}), flush=True)


class EventHandler(logging.Handler):
    """The runner's warnings as ``log`` events on stdout."""

    def emit(self, record: logging.LogRecord) -> None:
        emit("log", event_name=getattr(record, "event_name", ""), message=record.getMessage())


def job(job_seconds: float, slow_seconds: float):  # type: ignore[no-untyped-def]
    def record(context: JobContext) -> dict[str, int]:
        seconds = slow_seconds if context.job_id.startswith("slow-") else job_seconds
        row_id = context.session.execute(
            insert(runs_table).values(name=context.job_id, scheduled_for=context.scheduled_for, holder=context.leader)
            .returning(runs_table.c.id)
        ).scalar_one()
        context.session.commit()
        if seconds:
            time.sleep(seconds)
        context.session.execute(update(runs_table).where(runs_table.c.id == row_id).values(finished_at=func.clock_timestamp()))
        context.session.commit()
        return {}

    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lease", type=float, default=6.0)
    parser.add_argument("--job-seconds", type=float, default=0.0)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--step-signals", action="store_true")
    arguments = parser.parse_args()

    handler = EventHandler(level=logging.WARNING)
    for name in ("outboxkit.schedules", "outboxkit.storage.notify"):  # the whole schedules package
        logging.getLogger(name).addHandler(handler)
    logging.basicConfig(level=logging.WARNING)  # and everything on stderr, the fleet's log file

    clock = OffsetClock()
    if arguments.step_signals:
        def step(delta: timedelta) -> None:
            clock.step(delta)
            emit("stepped", offset_seconds=clock.offset.total_seconds())

        signal.signal(signal.SIGUSR1, lambda *_: step(STEP))
        signal.signal(signal.SIGUSR2, lambda *_: step(-STEP))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    engine = create_engine(
        arguments.database_url, pool_size=10, max_overflow=10, pool_pre_ping=True,
        connect_args={"application_name": f"fault-schedules:{arguments.name}"},
    )
    runner = ScheduleRunner(
        engine, jobs={"record": job(arguments.job_seconds, arguments.slow_seconds)}, clock=clock,
        holder=f"{arguments.name}:{os.getpid()}",
        lease_seconds=arguments.lease, max_idle_seconds=1.0, retry_seconds=0.5, max_workers=arguments.max_workers,
    )
    runner.start()
    emit("ready")
    stopping.wait()
    runner.stop(wait=True)
    engine.dispose()
    emit("stopped")


if __name__ == "__main__":
    main()
