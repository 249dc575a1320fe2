"""Enqueue throughput: the fast path (``outboxkit.enqueue``) against the ORM path and a bare Core insert.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, with the example ``WebhookOutbox`` (and its NOTIFY trigger, as an
application's migration installs it):

1. one row per committed transaction, ``--rows`` rows per way, in
   ``--rounds`` rounds that run the three ways back to back in a rotating
   order (so a load swing of the shared host hits every way alike):
   * fast path: ``Session`` + ``enqueue(session, WebhookOutbox, {...})``;
   * ORM: ``Session`` + ``session.add(WebhookOutbox(...))``;
   * raw Core: ``engine.begin()`` + ``connection.execute(insert(table), {...})``,
     the floor any helper over Core can reach;
2. batches of ``--batch-rows`` rows in one transaction, the same way round:
   ``enqueue_many`` (COPY), ``session.add_all`` and a Core executemany insert.

Each figure is the median over the rounds of rows per second, with the
client's CPU per row beside it (``time.process_time``: what the application
pays in its own request path).  The target for the fast path is 0.8 of raw
Core or more for one row, and 40,000 rows/s or more for a batch.

Run from the repository root::

    .venv/bin/python bench/enqueue.py --rows 3000 --batch-rows 20000

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import Engine, create_engine, insert, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from outboxkit import enqueue, enqueue_many  # noqa: E402
from outboxkit.storage.notify import install_trigger_sql  # noqa: E402

TARGET = "http://127.0.0.1:9/events"
# The outbox's Table, as the metadata holds it (the class's __table__ is typed FromClause, which insert() refuses).
WEBHOOK_TABLE = Base.metadata.tables[WebhookOutbox.__tablename__]


def values(number: int) -> dict[str, object]:
    return {"event": "bench.event", "target_url": TARGET, "payload": {"n": number, "workspace": f"ws-{number % 100}"}}


def one_fast_path(engine: Engine, count: int) -> None:
    for number in range(count):
        with Session(engine) as session, session.begin():
            enqueue(session, WebhookOutbox, values(number))


def one_orm(engine: Engine, count: int) -> None:
    for number in range(count):
        with Session(engine) as session, session.begin():
            session.add(WebhookOutbox(**values(number)))


def one_raw_core(engine: Engine, count: int) -> None:
    statement = insert(WEBHOOK_TABLE)
    for number in range(count):
        with engine.begin() as connection:
            connection.execute(statement, values(number))


def batch_fast_path(engine: Engine, count: int) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(session, WebhookOutbox, [values(number) for number in range(count)])


def batch_orm(engine: Engine, count: int) -> None:
    with Session(engine) as session, session.begin():
        session.add_all([WebhookOutbox(**values(number)) for number in range(count)])


def batch_raw_core(engine: Engine, count: int) -> None:
    with engine.begin() as connection:
        connection.execute(insert(WEBHOOK_TABLE), [values(number) for number in range(count)])


ONE_ROW = {"fast_path": one_fast_path, "orm": one_orm, "raw_core": one_raw_core}
BATCH = {"fast_path": batch_fast_path, "orm": batch_orm, "raw_core": batch_raw_core}


def timed(engine: Engine, way: Callable[[Engine, int], None], count: int) -> tuple[float, float]:
    """Rows per second and client CPU ms per row of one run; the table is emptied after it."""
    wall, cpu = time.perf_counter(), time.process_time()
    way(engine, count)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    with engine.begin() as connection:
        written = connection.execute(text(f"SELECT count(*) FROM {WebhookOutbox.__tablename__}")).scalar_one()
        connection.execute(text(f"TRUNCATE {WebhookOutbox.__tablename__}"))
    if written != count:
        raise RuntimeError(f"{way.__name__} wrote {written} rows, expected {count}")
    return count / wall, cpu * 1000 / count


def rounds(
    engine: Engine, ways: Mapping[str, Callable[[Engine, int], None]], count: int, repeat: int
) -> dict[str, tuple[float, float]]:
    """Median rows/s and CPU ms/row per way over ``repeat`` rounds, each round in a rotated order."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    names = list(ways)
    for round_number in range(repeat):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in order:
            results[name].append(timed(engine, ways[name], count))
            print(f"  round {round_number + 1} {name}: {results[name][-1][0]:.0f} rows/s, {results[name][-1][1]:.3f} ms CPU/row")
    return {
        name: (statistics.median(rate for rate, _ in runs), statistics.median(cpu for _, cpu in runs))
        for name, runs in results.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="enqueue benchmark (see the module docstring)")
    parser.add_argument("--rows", type=int, default=3_000, help="rows per way for one row per transaction (default 3000)")
    parser.add_argument("--batch-rows", type=int, default=20_000, help="rows per batch (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way (default 3)")
    arguments = parser.parse_args(argv)
    if arguments.rows < 1 or arguments.batch_rows < 1 or arguments.rounds < 1:
        parser.error("--rows, --batch-rows and --rounds must be >= 1")

    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=1)
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as connection:
            for statement in install_trigger_sql(WebhookOutbox):
                connection.execute(text(statement))
            synchronous_commit = connection.execute(text("SHOW synchronous_commit")).scalar_one()
        print(
            f"database {scratch.name}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
            f"server synchronous_commit {synchronous_commit}"
        )
        print(f"one row per transaction, {arguments.rows} rows per way, {arguments.rounds} rounds:")
        one = rounds(engine, ONE_ROW, arguments.rows, arguments.rounds)
        print(f"batches of {arguments.batch_rows} rows in one transaction, {arguments.rounds} rounds:")
        batch = rounds(engine, BATCH, arguments.batch_rows, arguments.rounds)
        ratio = one["fast_path"][0] / one["raw_core"][0]
        for label, results in (("one row", one), ("batch", batch)):
            print(
                f"{label}: "
                + "; ".join(f"{name} {rate:.0f} rows/s ({cpu:.3f} ms CPU/row)" for name, (rate, cpu) in results.items())
            )
        print(
            f"fast path / raw Core, one row per transaction: {ratio:.2f} (target >= 0.8); "
            f"batch fast path {batch['fast_path'][0]:.0f} rows/s (target >= 40000)"
        )
        print(f"load average at the end: {os.getloadavg()[0]:.2f} (a busy host depresses every rate above)")
        summary: dict[str, float] = {}
        for label, results in (("one", one), ("batch", batch)):
            for name, (rate, cpu) in results.items():
                summary[f"enqueue_{label}_rows_per_s_{name}"] = round(rate, 1)
                summary[f"enqueue_{label}_client_cpu_ms_per_row_{name}"] = round(cpu, 4)
        summary["enqueue_one_fast_path_ratio_to_raw_core"] = round(ratio, 3)
        print(json.dumps(summary))
        return 0
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
