"""A scheduler worker process for the fault suite: an application process that campaigns to lead.

::

    python -m tests.faults.scheduler_worker --database-url postgresql+psycopg://... --name sched-1

It runs what an application process runs (``kit.lifespan``):
``OutboxKit(engine, [FaultEvent])`` with its drain loops (``kit.worker``:
claim on NOTIFY and at due times, leader or not) and
``kit.scheduler.elect()``, so the elected process also runs the safety-net
drain on an interval.  It also
registers ``fault.heartbeat``, a job every ``--heartbeat`` seconds whose fire
times are aligned on a fixed start (every process computes the same
occurrences, so the fence can key on them); each run writes one row into
``fault_heartbeat_runs`` (no unique constraint there: a second run of one
occurrence would show).  Settings are production's (a failed campaign starts
nothing) with short tick and probe intervals from the command line.

Stdout carries one JSON object per line, each stamped ``at`` (``time.time()``):
``ready``; ``role`` whenever the election state changes (``standby``,
``promoting`` once the lock is acquired, ``leader`` once the scheduler runs);
``listening`` whenever its NOTIFY listener has (re)connected (``generation``);
and ``stopped`` on the way out.  SIGTERM resigns (the lock is released).
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
import warnings
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Column, DateTime, Engine, MetaData, Table, Text, create_engine, func, insert

from outboxkit import HttpTransport, OutboxKit, OutboxKitSettings
from outboxkit.schedules.jobs import JobContext, every
from tests.faults.models import FaultEvent

__all__ = ["HEARTBEAT_JOB_ID", "HEARTBEAT_START", "heartbeat_runs", "install_heartbeat_table"]

HEARTBEAT_JOB_ID = "fault.heartbeat"
# A fixed start: every process derives the same fire times from it.
HEARTBEAT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)

heartbeat_metadata = MetaData()
heartbeat_runs = Table(
    "fault_heartbeat_runs",
    heartbeat_metadata,
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("ran_at", DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()),
    Column("leader", Text, nullable=False),
)


def install_heartbeat_table(engine: Engine) -> None:
    heartbeat_metadata.create_all(engine)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), "at": time.time(), **fields}), flush=True)


def record_heartbeat(context: JobContext) -> dict[str, int]:
    context.session.execute(insert(heartbeat_runs).values(scheduled_for=context.scheduled_for, leader=context.leader))
    context.session.commit()
    return {}  # nothing worth a log line


def run(arguments: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    engine = create_engine(
        arguments.database_url, pool_size=3, max_overflow=2, connect_args={"application_name": arguments.name}
    )
    settings = OutboxKitSettings(
        environment="production",
        leader_tick_seconds=arguments.tick,
        standby_probe_seconds=arguments.probe,
        drain_interval_seconds=arguments.drain_interval,
        job_history_limit=100_000,  # keep every fence row: the scenario reads them all
    )
    transport = HttpTransport(headers={"X-Fault-Worker": arguments.name})
    kit = OutboxKit(engine, [FaultEvent], settings=settings, transport=transport)
    try:
        with warnings.catch_warnings():  # an elected job on purpose: the scenario watches the leader run it
            warnings.filterwarnings("ignore", "kit.scheduler.add_job is deprecated", DeprecationWarning)
            kit.scheduler.add_job(
                HEARTBEAT_JOB_ID, record_heartbeat, every(seconds=arguments.heartbeat, start=HEARTBEAT_START)
            )
        kit.worker.start()
        election = kit.scheduler.elect()
        emit("ready", name=arguments.name)
        role, listening, parent = None, None, os.getppid()
        while not stop.wait(0.01):
            if os.getppid() != parent:  # the test runner died without stopping us
                break
            state = election.state.value
            if state != role:
                role = state
                emit("role", role=state, backend_pid=election.backend_pid)
            listener = kit.worker.listener
            if listener is not None and listener.generation and (id(listener), listener.generation) != listening:
                listening = (id(listener), listener.generation)
                emit("listening", generation=listener.generation, backend_pid=listener.backend_pid)
    finally:
        kit.close()
        transport.close()
        engine.dispose()
    emit("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--name", required=True, help="application_name of its pool, X-Fault-Worker header")
    parser.add_argument("--tick", type=float, default=0.3, help="leader_tick_seconds")
    parser.add_argument("--probe", type=float, default=0.3, help="standby_probe_seconds")
    parser.add_argument("--drain-interval", type=float, default=0.5, help="drain_interval_seconds")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="seconds between two heartbeat occurrences")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("outboxkit").setLevel(logging.INFO)
    return run(arguments)


if __name__ == "__main__":
    sys.exit(main())
