"""Drain scaling: the first delivery of a new process, and throughput with 1 and 4 drainer processes.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, with the example ``WebhookOutbox`` and the light receiver
(``bench/receiver.py``) in its own process:

1. first delivery after start: one row waits; a new process does what
   ``kit.lifespan`` does on start-up (``bench/scaling_worker.py --mode
   lifespan``); the time from that start-up to the receiver seeing the row.
   Drains do not wait for leadership, so this is not the election's
   promotion tick (15 s);
2. ``--rows`` due rows drained by 1 ``DrainWorker`` process, then by 4, each
   timed from ``go`` to the last row ``done`` (polled every 50 ms);
3. duplicates: keys the receiver saw more than once (none without a crash).

Run from the repository root::

    .venv/bin/python bench/drain_scaling.py --rows 20000

The last line printed is one JSON object: ``first_delivery_after_start_s``,
``rows_per_s_1_process``, ``rows_per_s_4_processes``, ``scaling_ratio_4``,
``duplicates``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from bench.ceilings import insert_pending_rows, scratch_database, vacuum_analyze  # noqa: E402
from bench.drain_throughput import SUBPROCESS_ENV, ReceiverProcess  # noqa: E402
from outboxkit.storage.notify import install_trigger_sql  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

DEFAULT_SERVER = "postgresql://root@127.0.0.1:5432/test"
TABLE = WebhookOutbox.__tablename__
WORKER = [sys.executable, str(ROOT / "bench" / "scaling_worker.py")]


def spawn(sqlalchemy_url: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WORKER, "--database-url", sqlalchemy_url, "--mode", mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )


def finish(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            assert process.stdin is not None  # spawn() opens a pipe
            try:
                process.stdin.write("exit\n")
                process.stdin.flush()
            except BrokenPipeError:
                pass
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def done_count(connection: psycopg.Connection) -> int:
    row = connection.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'done'").fetchone()
    assert row is not None  # count(*) returns one row
    return int(row[0])


def first_delivery_after_start(database_url: str, sqlalchemy_url: str, receiver: ReceiverProcess) -> float:
    with psycopg.connect(database_url) as connection:
        insert_pending_rows(connection, TABLE, count=1, target_url=f"{receiver.url}/events")
    process = spawn(sqlalchemy_url, "lifespan")
    assert process.stdout is not None  # spawn() opens a pipe
    try:
        line = process.stdout.readline()
        if not line.startswith("starting "):
            raise RuntimeError(f"the lifespan process did not start: {line!r}")
        started = float(line.split()[1])
        deadline = time.monotonic() + 60
        while not receiver.keys():
            if time.monotonic() > deadline:
                raise RuntimeError("no delivery within 60 s of start-up")
            time.sleep(0.005)
        return time.time() - started
    finally:
        finish([process])


def drain_with(processes: int, *, rows: int, database_url: str, sqlalchemy_url: str, receiver: ReceiverProcess) -> float:
    with psycopg.connect(database_url) as connection:
        connection.execute(f"TRUNCATE {TABLE}")
        connection.commit()
        insert_pending_rows(connection, TABLE, count=rows, target_url=f"{receiver.url}/events")
        vacuum_analyze(connection, TABLE)
        workers = [spawn(sqlalchemy_url, "worker") for _ in range(processes)]
        try:
            for worker in workers:
                assert worker.stdout is not None and worker.stdin is not None  # spawn() opens both pipes
                line = worker.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError(f"a drainer did not start: {line!r}")
            started = time.monotonic()
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            while done_count(connection) < rows:
                if time.monotonic() - started > 600:
                    raise RuntimeError(f"{processes} process(es) did not drain {rows} rows within 600 s")
                time.sleep(0.05)
            return rows / (time.monotonic() - started)
        finally:
            finish(workers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drain scaling benchmark (see the module docstring)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows drained by each run (default 20000)")
    arguments = parser.parse_args(argv)
    if arguments.rows < 1:
        parser.error("--rows must be >= 1")

    scratch = scratch_database(DEFAULT_SERVER)
    server_url, database = scratch.server_url, scratch.name
    database_url, sqlalchemy_url = scratch.database_url, scratch.sqlalchemy_url
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    receiver = None
    try:
        engine = create_engine(sqlalchemy_url)
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)  # the attempt history and pauses a migrated database has
        with engine.begin() as connection:
            for statement in install_trigger_sql(WebhookOutbox):
                connection.exec_driver_sql(statement)
        engine.dispose()
        receiver = ReceiverProcess()
        print(f"database {database}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; rows {arguments.rows}")

        first = first_delivery_after_start(database_url, sqlalchemy_url, receiver)
        print(f"first delivery {first:.3f} s after a new process's lifespan start-up")
        receiver.reset()
        rates = {}
        for processes in (1, 4):
            rates[processes] = drain_with(
                processes, rows=arguments.rows, database_url=database_url, sqlalchemy_url=sqlalchemy_url, receiver=receiver
            )
            print(f"{processes} drainer process(es): {rates[processes]:.0f} rows/s")
        counts = collections.Counter(receiver.keys())
        duplicates = sum(count - 1 for count in counts.values())
        expected = 2 * arguments.rows
        if sum(counts.values()) < expected:
            print(f"PROBLEM: the receiver saw {sum(counts.values())} requests, expected at least {expected}")
        print(f"load average at the end: {os.getloadavg()[0]:.2f} (a busy host depresses every rate above)")
        summary = {
            "first_delivery_after_start_s": round(first, 3),
            "rows_per_s_1_process": round(rates[1], 1),
            "rows_per_s_4_processes": round(rates[4], 1),
            "scaling_ratio_4": round(rates[4] / rates[1], 2),
            "duplicates": duplicates,
        }
        print(json.dumps(summary))
        return 0 if duplicates == 0 else 1
    finally:
        if receiver is not None:
            receiver.stop()
        with psycopg.connect(server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
