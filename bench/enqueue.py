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

3. concurrent producers (``--producers``, 1, 4 and 16 by default), each on
   its own psycopg connection inserting one row per committed transaction for
   ``--producer-seconds``, into three copies of the outbox table, in rotating
   order: ``webhook_outbox`` with the kit's trigger (an insert notifies only
   when no wake-up is pending, ``outboxkit.storage.wakeups``), a copy whose
   trigger notifies on every insert (what the kit installed before: the A/B
   baseline), and a copy with no trigger.  Meanwhile a thread clears the
   pending wake-up every ``--clear-ms`` (10 ms), as a drain loop that keeps
   catching up would, so inserts do notify at that rate;
4. an async producer, one row per transaction: ``enqueue_async`` on an
   ``AsyncSession`` (psycopg's async driver, on the event loop) against the
   sync fast path called through ``asyncio.to_thread`` (a thread hop per row);
5. pgqueuer's enqueue of one job per transaction on the same server, when
   pgqueuer is installed (it is not a dependency of outboxkit), for comparison.

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
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import Engine, create_engine, insert, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from outboxkit import enqueue, enqueue_async, enqueue_many  # noqa: E402
from outboxkit.storage.notify import channel_for, install_trigger_sql  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402
from outboxkit.storage.wakeups import Wakeups  # noqa: E402

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


# The copies of the outbox table for the producers: the trigger's variants, everything else equal.
PRODUCER_TABLES = {
    "kit_trigger": WEBHOOK_TABLE.name, "notify_every_insert": "webhook_outbox_every", "no_trigger": "webhook_outbox_plain",
}


def create_producer_tables(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in ("webhook_outbox_every", "webhook_outbox_plain"):
            connection.execute(text(f"CREATE TABLE {table} (LIKE {WEBHOOK_TABLE.name} INCLUDING ALL)"))
        channel = channel_for(WebhookOutbox)
        connection.execute(text(
            "CREATE FUNCTION bench_notify_every_insert() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$"
        ))
        connection.execute(text(
            "CREATE TRIGGER bench_every AFTER INSERT ON webhook_outbox_every "
            "FOR EACH STATEMENT EXECUTE FUNCTION bench_notify_every_insert()"
        ))


def producers_rate(url: str, engine: Engine, table: str, producers: int, seconds: float, clear_ms: float) -> float:
    """Rows per second of ``producers`` threads, each inserting one row per transaction, while wake-ups are cleared."""
    counts = [0] * producers
    start = threading.Barrier(producers + 1)
    stop = threading.Event()
    statement = (
        f"INSERT INTO {table} (event, target_url, payload, idempotency_key, destination) "
        "VALUES ('bench.event', %s, %s, gen_random_uuid(), 'http://127.0.0.1:9')"
    )

    def produce(index: int) -> None:
        with psycopg.connect(url) as connection:
            start.wait()
            while not stop.is_set():
                connection.execute(statement, (TARGET, '{"n": 1}'))
                connection.commit()
                counts[index] += 1

    def clear() -> None:
        wakeups = Wakeups(channel_for(WebhookOutbox))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            while not stop.wait(clear_ms / 1000):
                wakeups.clear(connection)

    threads = [threading.Thread(target=produce, args=(index,)) for index in range(producers)]
    clearer = threading.Thread(target=clear)
    for thread in threads:
        thread.start()
    clearer.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    clearer.join()
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {table}"))
    return sum(counts) / elapsed


def producer_rounds(
    url: str, engine: Engine, levels: list[int], seconds: float, clear_ms: float, repeat: int
) -> dict[int, dict[str, float]]:
    results: dict[int, dict[str, list[float]]] = {level: {name: [] for name in PRODUCER_TABLES} for level in levels}
    names = list(PRODUCER_TABLES)
    for round_number in range(repeat):
        for level in levels:
            order = names[round_number % len(names) :] + names[: round_number % len(names)]
            for name in order:
                rate = producers_rate(url, engine, PRODUCER_TABLES[name], level, seconds, clear_ms)
                results[level][name].append(rate)
                print(f"  round {round_number + 1}, {level} producers, {name}: {rate:.0f} rows/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return {level: {name: statistics.median(rates) for name, rates in by_name.items()} for level, by_name in results.items()}


def async_rates(sqlalchemy_url: str, engine: Engine, count: int, repeat: int) -> dict[str, float]:
    """Rows per second of an async producer: ``enqueue_async`` on the loop, and the sync path through a thread."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def on_the_loop(async_engine: Any) -> None:
        for number in range(count):
            async with AsyncSession(async_engine) as session, session.begin():
                await enqueue_async(session, WebhookOutbox, values(number))

    async def through_a_thread(async_engine: Any) -> None:
        for number in range(count):
            await asyncio.to_thread(one_fast_path_row, engine, number)

    ways = {"enqueue_async": on_the_loop, "to_thread": through_a_thread}
    rates: dict[str, list[float]] = {name: [] for name in ways}

    async def run() -> None:
        async_engine = create_async_engine(sqlalchemy_url, pool_size=1)
        try:
            for round_number in range(repeat):
                names = list(ways) if round_number % 2 == 0 else list(reversed(ways))
                for name in names:
                    began = time.perf_counter()
                    await ways[name](async_engine)
                    rates[name].append(count / (time.perf_counter() - began))
                    with engine.begin() as connection:
                        connection.execute(text(f"TRUNCATE {WebhookOutbox.__tablename__}"))
                    print(f"  round {round_number + 1} async {name}: {rates[name][-1]:.0f} rows/s", flush=True)
        finally:
            await async_engine.dispose()

    asyncio.run(run())
    return {name: statistics.median(values) for name, values in rates.items()}


def one_fast_path_row(engine: Engine, number: int) -> None:
    with Session(engine) as session, session.begin():
        enqueue(session, WebhookOutbox, values(number))


def pgqueuer_rate(url: str, count: int) -> float | None:
    """pgqueuer's enqueue, one job per transaction (autocommit), on its own schema in the same database; None
    without pgqueuer."""
    try:
        from pgqueuer import Queries
    except ImportError:
        return None

    async def run() -> float:
        connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with connection:
            queries = Queries.from_psycopg_connection(connection)
            await queries.install()
            began = time.perf_counter()
            for number in range(count):
                await queries.enqueue("bench", f'{{"n": {number}}}'.encode())
            return count / (time.perf_counter() - began)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="enqueue benchmark (see the module docstring)")
    parser.add_argument("--rows", type=int, default=3_000, help="rows per way for one row per transaction (default 3000)")
    parser.add_argument("--batch-rows", type=int, default=20_000, help="rows per batch (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way (default 3)")
    parser.add_argument("--producers", default="1,4,16", help="concurrent producers to measure (default 1,4,16)")
    parser.add_argument("--producer-seconds", type=float, default=4.0, help="seconds per producer run (default 4)")
    parser.add_argument("--clear-ms", type=float, default=10.0, help="the stand-in drain loop's clear interval")
    arguments = parser.parse_args(argv)
    if arguments.rows < 1 or arguments.batch_rows < 1 or arguments.rounds < 1:
        parser.error("--rows, --batch-rows and --rounds must be >= 1")

    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=1)
    try:
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)  # outboxkit_wakeups, which the trigger uses
        create_producer_tables(engine)
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
        levels = [int(level) for level in arguments.producers.split(",")]
        print(f"concurrent producers, one row per transaction, {arguments.producer_seconds:g} s each, "
              f"wake-ups cleared every {arguments.clear_ms:g} ms:")
        producers = producer_rounds(
            scratch.database_url, engine, levels, arguments.producer_seconds, arguments.clear_ms, arguments.rounds
        )
        print(f"an async producer, one row per transaction, {arguments.rows} rows per way:")
        async_producer = async_rates(scratch.sqlalchemy_url, engine, arguments.rows, arguments.rounds)
        pgqueuer = pgqueuer_rate(scratch.database_url, arguments.rows)
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
        summary["enqueue_one_orm_ratio_to_fast_path"] = round(one["orm"][0] / one["fast_path"][0], 3)
        for level, by_name in producers.items():
            for name, rate in by_name.items():
                summary[f"enqueue_{level}_producers_rows_per_s_{name}"] = round(rate, 1)
            summary[f"enqueue_{level}_producers_ratio_to_no_trigger"] = round(by_name["kit_trigger"] / by_name["no_trigger"], 3)
            summary[f"enqueue_{level}_producers_ratio_to_no_trigger_notify_every_insert"] = round(
                by_name["notify_every_insert"] / by_name["no_trigger"], 3
            )
        for name, rate in async_producer.items():
            summary[f"enqueue_one_async_rows_per_s_{name}"] = round(rate, 1)
        if pgqueuer is not None:
            summary["pgqueuer_enqueue_one_rows_per_s"] = round(pgqueuer, 1)
            summary["enqueue_one_fast_path_ratio_to_pgqueuer"] = round(one["fast_path"][0] / pgqueuer, 3)
            print(f"pgqueuer, one job per transaction: {pgqueuer:.0f} rows/s")
        else:
            print("pgqueuer is not installed: compare the fast path with raw Core above")
        summary["load_average"] = round(os.getloadavg()[0], 2)
        print(json.dumps(summary))
        return 0
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
