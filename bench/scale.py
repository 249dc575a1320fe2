"""Scale: a partitioned outbox against a plain one of the same size, and what a pinned xmin costs the drain.

In a scratch database it creates on the test server (``server_url()`` from tests/support/database.py) and
drops at the end:

1. **fill**: two outbox tables of one shape, ``scale_plain_outbox`` (one table) and ``scale_part_outbox``
   (``partition_by="day"``, made by ``create_partitioned_outbox`` and the partitions job), each filled in SQL
   with ``generate_series``: ``--rows`` rows in all (default 5,000,000), of which one in fifty pending (the
   issue's 1M among 50M; half due), 10,000 stuck and the rest ``done``, created and delivered over
   ``--days`` days (default 10); ``VACUUM ANALYZE``;
2. **claim**: the drain's real claim statement (``claim_sql``, batch of 50) on each table, ``--repeat``
   times, each claim rolled back so every run sees the same table: p50 and p99 of the round trip;
3. **admin**: the overview's counts (``AdminQueries.status_counts``) and the first page of the stuck and the
   pending list (``AdminQueries.page``), ``--repeat`` times each: p95;
4. **retention**: the oldest day of ``done`` rows dropped as a partition (``drop_done_partitions``, which
   looks for unfinished rows under the lock first), against the plain table's retention deleting the same
   rows (``delete_delivered_rows``, the kit's batched DELETE) and a single ``DELETE`` of them;
5. **held xmin**: ``--drain-rows`` due rows (default 60,000: about a minute at this host's drain rate;
   ``--long`` makes it 600,000, the ten minutes the PgQue measurement used) drained by a real drainer
   process (``bench/drain_worker.py``) into the local receiver, once with nothing else running, once while
   another session of the database holds a ``REPEATABLE READ`` transaction open from before the drain to
   after it, and once more without; rows per second and the outbox's dead tuples at the end of each.

    .venv/bin/python bench/scale.py                          # 5M rows and a one-minute drain, ~15 minutes
    .venv/bin/python bench/scale.py --rows 500000 --drain-rows 10000 --repeat 50

The last line printed is one JSON object; keys ending ``_50m`` are measured at ``--rows`` (``rows`` says how
many).  Targets: ``claim_p99_ms_50m`` <= 5, ``retention_s_per_day_partition`` <= 1,
``admin_overview_p95_ms_50m`` <= 100, ``held_xmin_drain_ratio`` >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base as ExampleBase  # noqa: E402
from sqlalchemy import Engine, Text, create_engine, text  # noqa: E402
from sqlalchemy.dialects.postgresql import JSONB  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: E402

from bench.drain_throughput import ReceiverProcess, run_drainer  # noqa: E402
from bench.growth import percentile, timed  # noqa: E402
from outboxkit import Delivery, Outbox, OutboxOptions  # noqa: E402
from outboxkit.leader.partitions import drop_done_partitions, ensure_partitions  # noqa: E402
from outboxkit.leader.retention import RetentionLimits, delete_delivered_rows  # noqa: E402
from outboxkit.migrations.partitioned_tables import create_partitioned_outbox_sql  # noqa: E402
from outboxkit.storage.drain_queries import claim_sql, quote_table, rate_parameters  # noqa: E402
from outboxkit.storage.operator_queries import admin_queries_for  # noqa: E402
from outboxkit.storage.partitions import interval_start  # noqa: E402
from outboxkit.storage.row_filter import RowFilter  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402
from tests.support.database import server_url  # noqa: E402


class ScaleBase(DeclarativeBase):
    pass


class ScaleOutbox(Outbox):
    """The shape both tables share."""

    __abstract__ = True

    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json=self.payload)


class ScalePlain(ScaleOutbox, ScaleBase):
    __tablename__ = "scale_plain_outbox"
    __outbox__ = OutboxOptions(job_name="scale-plain")


class ScalePartitioned(ScaleOutbox, ScaleBase):
    __tablename__ = "scale_part_outbox"
    __outbox__ = OutboxOptions(job_name="scale-part", partition_by="day")


OUTBOXES: dict[str, type[Outbox]] = {"plain": ScalePlain, "partitioned": ScalePartitioned}
STUCK_ROWS = 10_000


def describe(samples: list[float]) -> str:
    return (f"p50 {statistics.median(samples):.2f} ms, p95 {percentile(samples, 0.95):.2f} ms, "
            f"p99 {percentile(samples, 0.99):.2f} ms")


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


class Scratch:
    def __init__(self, server: str) -> None:
        self.server = server
        self.name = f"outboxkit_bench_scale_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.url = make_url(server).set(database=self.name).render_as_string(hide_password=False)
        self.sqlalchemy_url = make_url(self.url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)

    def create(self, start: datetime, days: int) -> Engine:
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{self.name}"')
        engine = create_engine(self.sqlalchemy_url, pool_size=2)
        ScalePlain.__table__.create(engine)  # type: ignore[attr-defined]
        ExampleBase.metadata.create_all(engine)
        kit_metadata.create_all(engine)
        with engine.begin() as connection:
            for statement in create_partitioned_outbox_sql(ScalePartitioned, now=start):
                connection.execute(text(statement))
        for day in range(days + 1):
            ensure_partitions(engine, ScalePartitioned, now=start + timedelta(days=day))
        return engine

    def drop(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True)


def fill(scratch: Scratch, outbox: type[Outbox], *, rows: int, start: datetime, days: int) -> float:
    """Done rows over ``days`` days from ``start``, then pending (half due) and stuck rows on the last day."""
    table = quote_table(outbox.__table__)  # type: ignore[attr-defined]
    pending = rows // 50
    done = rows - pending - STUCK_ROWS
    constraint = f"uq_{outbox.__tablename__}_idempotency_key"  # type: ignore[attr-defined]
    unique = "(idempotency_key, created_at)" if outbox.__outbox__.partition_by else "(idempotency_key)"
    values = "'http://127.0.0.1:9/hook', jsonb_build_object('n', g)"
    last_day = start + timedelta(days=days - 1, hours=1)
    statements: list[tuple[str, dict[str, object]]] = [
        # Random UUIDs into a unique index one by one cost minutes; one sorted build after the load does not.
        (f"ALTER TABLE {table} DROP CONSTRAINT {constraint}", {}),
        (
            f"INSERT INTO {table} (target_url, payload, status, attempts, last_status_code, next_attempt_at, "
            "created_at, updated_at, delivered_at) "
            f"SELECT {values}, 'done', 1, 200, at, at, at, at "
            "FROM (SELECT g, %(start)s::timestamptz + g * (%(span)s::interval / %(count)s) AS at "
            "      FROM generate_series(1, %(count)s) AS g) AS spread",
            {"count": done, "start": start, "span": timedelta(days=days - 1)},
        ),
        (
            f"INSERT INTO {table} (target_url, payload, status, attempts, last_status_code, last_error, "
            "next_attempt_at, created_at) "
            f"SELECT {values}, 'stuck', 24, 503, 'max attempts (24) reached', now() - g * interval '1 second', "
            "%(day)s FROM generate_series(1, %(count)s) AS g",
            {"count": STUCK_ROWS, "day": last_day},
        ),
        (
            f"INSERT INTO {table} (target_url, payload, attempts, next_attempt_at, created_at) "
            f"SELECT {values}, 1 + g %% 5, "
            "CASE WHEN g %% 2 = 0 THEN now() + g * interval '1 second' ELSE now() - g * interval '1 millisecond' END, "
            "%(day)s FROM generate_series(1, %(count)s) AS g",
            {"count": pending, "day": last_day},
        ),
        (f"ALTER TABLE {table} ADD CONSTRAINT {constraint} UNIQUE {unique}", {}),
    ]
    started = time.perf_counter()
    with scratch.connect() as connection:
        connection.execute("SET maintenance_work_mem = '256MB'")
        for statement, parameters in statements:
            connection.execute(statement, parameters)
        connection.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - started


def measure_claims(scratch: Scratch, outbox: type[Outbox], repeat: int) -> list[float]:
    table = quote_table(outbox.__table__)  # type: ignore[attr-defined]
    statement = re.sub(r"(?<!:):(\w+)", r"%(\1)s", claim_sql(table))
    samples = []
    with psycopg.connect(scratch.url) as connection:
        for number in range(repeat + 5):
            now = datetime.now(timezone.utc)
            parameters = {"now": now, "lease_until": now + timedelta(minutes=5), "limit": 50, "token": uuid.uuid4(),
                          "outbox": outbox.__outbox__.job_name, "after": None, "cap": 50, "unknown_suspect": True,
                          "steps": 200, "probes": 1, **rate_parameters(None)}
            started = time.perf_counter()
            claimed = connection.execute(statement, parameters).fetchall()
            elapsed = (time.perf_counter() - started) * 1000
            connection.rollback()
            if len(claimed) != 50:
                raise RuntimeError(f"the claim returned {len(claimed)} rows, expected 50")
            if number >= 5:
                samples.append(elapsed)
    return samples


def measure_admin(engine: Engine, outbox: type[Outbox], repeat: int) -> dict[str, list[float]]:
    queries = admin_queries_for(outbox)
    with engine.connect() as connection:
        counts = queries.status_counts(connection, now=datetime.now(timezone.utc))
        print(f"  {outbox.__outbox__.job_name} counts: {counts}")
        return {
            "overview": timed(lambda: queries.status_counts(connection, now=datetime.now(timezone.utc)), repeat),
            **{
                f"list_{status}": timed(
                    lambda status=status: queries.page(  # type: ignore[misc]
                        connection, status=status, row_filter=RowFilter(), after=None, before=None, limit=51
                    ),
                    repeat,
                )
                for status in ("stuck", "pending")
            },
        }


def measure_retention(scratch: Scratch, engine: Engine, start: datetime) -> dict[str, float]:
    day_end = interval_start(start, "day") + timedelta(days=1)
    with scratch.connect() as connection:
        day_rows = connection.execute(
            "SELECT count(*) FROM scale_part_outbox WHERE created_at < %(end)s", {"end": day_end}
        ).fetchone()[0]  # type: ignore[index]
    started = time.perf_counter()
    dropped = drop_done_partitions(engine, ScalePartitioned, older_than=day_end)
    dropping = time.perf_counter() - started
    started = time.perf_counter()
    deleted = delete_delivered_rows(engine, ScalePlain, older_than=day_end, limits=RetentionLimits(max_rows=10**9))
    batched = time.perf_counter() - started
    print(f"retention of the oldest day ({day_rows:,} done rows): partition dropped in {dropping:.3f} s ({dropped}); "
          f"the plain table's batched DELETE took {batched:.1f} s for {deleted:,} rows ({load()})")
    # The same rows again, deleted by one statement: fill them back (outside the timing), then DELETE them.
    with scratch.connect() as connection:
        connection.execute(
            "INSERT INTO scale_plain_outbox (target_url, payload, status, attempts, created_at, updated_at, delivered_at) "
            "SELECT 'http://127.0.0.1:9/hook', '{}', 'done', 1, at, at, at FROM (SELECT %(start)s::timestamptz "
            "+ g * (interval '1 day' / %(count)s) AS at FROM generate_series(0, %(count)s - 1) AS g) AS spread",
            {"start": interval_start(start, "day"), "count": day_rows},
        )
        connection.execute("VACUUM ANALYZE scale_plain_outbox")
        started = time.perf_counter()
        connection.execute(
            "DELETE FROM scale_plain_outbox WHERE status = 'done' AND delivered_at < %(end)s", {"end": day_end}
        )
        single = time.perf_counter() - started
    print(f"  one DELETE of the same rows: {single:.1f} s")
    return {"partition": dropping, "batched_delete": batched, "single_delete": single, "day_rows": day_rows}


def dead_tuples(scratch: Scratch) -> int:
    with scratch.connect() as connection:
        connection.execute("SELECT pg_stat_force_next_flush()")
        row = connection.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'webhook_outbox'"
        ).fetchone()
    return int(row[0]) if row else -1


def measure_held_xmin(scratch: Scratch, rows: int) -> dict[str, Any]:
    receiver = ReceiverProcess()
    results: dict[str, list[float]] = {"free": [], "held": []}
    dead: dict[str, list[int]] = {"free": [], "held": []}
    try:
        for label in ("free", "held", "free"):
            receiver.reset()
            with scratch.connect() as connection:
                connection.execute("TRUNCATE webhook_outbox")
                connection.execute(
                    "INSERT INTO webhook_outbox (event, target_url, payload, next_attempt_at) "
                    "SELECT 'bench.event', %(url)s, jsonb_build_object('n', g), "
                    "now() - interval '2 hours' + g * interval '1 millisecond' FROM generate_series(1, %(count)s) AS g",
                    {"url": f"{receiver.url}/events", "count": rows},
                )
                connection.execute("VACUUM ANALYZE webhook_outbox")
            holder = psycopg.connect(scratch.url)
            try:
                if label == "held":  # a transaction elsewhere whose snapshot predates every change the drain makes
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute("SELECT count(*) FROM outboxkit_job_runs")
                run = run_drainer(scratch.sqlalchemy_url, scratch.server, scratch.name, expected=rows, concurrency=None)
                dead[label].append(dead_tuples(scratch))
            finally:
                holder.close()
            results[label].append(run.rows_per_s)
            print(f"drain of {rows:,} rows, {'xmin held' if label == 'held' else 'nothing held'}: "
                  f"{run.rows_per_s:.0f} rows/s ({run.report['elapsed_s']:.1f} s), dead tuples at the end "
                  f"{dead[label][-1]:,} ({load()})")
    finally:
        receiver.stop()
    free = statistics.mean(results["free"])
    return {
        "drain_rows_per_s": round(free),
        "drain_rows_per_s_held_xmin": round(results["held"][0]),
        "held_xmin_drain_ratio": round(results["held"][0] / free, 3),
        "dead_tuples_free": dead["free"][-1],
        "dead_tuples_held_xmin": dead["held"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--drain-rows", type=int, default=60_000)
    parser.add_argument("--long", action="store_true", help="drain 600,000 rows (about ten minutes here)")
    parser.add_argument("--skip-fill", action="store_true", help="only the held-xmin drain")
    arguments = parser.parse_args()
    drain_rows = 600_000 if arguments.long else arguments.drain_rows
    start = interval_start(datetime.now(timezone.utc), "day") - timedelta(days=arguments.days - 1)
    scratch = Scratch(server_url())
    engine = scratch.create(start, arguments.days)
    result: dict[str, Any] = {"rows": arguments.rows, "load_average_start": [round(v, 2) for v in os.getloadavg()]}
    try:
        if not arguments.skip_fill:
            for label, outbox in OUTBOXES.items():
                seconds = fill(scratch, outbox, rows=arguments.rows, start=start, days=arguments.days)
                print(f"filled {label} ({arguments.rows:,} rows) in {seconds:.0f} s ({load()})")
            for label, outbox in OUTBOXES.items():
                claims = measure_claims(scratch, outbox, arguments.repeat)
                print(f"claim, {label}: {describe(claims)} ({load()})")
                admin = measure_admin(engine, outbox, arguments.repeat)
                for name, samples in admin.items():
                    print(f"  admin {name}, {label}: {describe(samples)}")
                suffix = "" if label == "partitioned" else "_plain"
                result[f"claim_p99_ms_50m{suffix}"] = round(percentile(claims, 0.99), 2)
                result[f"claim_p50_ms_50m{suffix}"] = round(statistics.median(claims), 2)
                result[f"admin_overview_p95_ms_50m{suffix}"] = round(percentile(admin["overview"], 0.95), 2)
                result[f"admin_list_stuck_p95_ms_50m{suffix}"] = round(percentile(admin["list_stuck"], 0.95), 2)
                result[f"admin_list_pending_p95_ms_50m{suffix}"] = round(percentile(admin["list_pending"], 0.95), 2)
            retention = measure_retention(scratch, engine, start)
            result["retention_s_per_day_partition"] = round(retention["partition"], 3)
            result["retention_s_per_day_batched_delete"] = round(retention["batched_delete"], 1)
            result["retention_s_per_day_single_delete"] = round(retention["single_delete"], 1)
            result["retention_day_rows"] = retention["day_rows"]
        result.update(measure_held_xmin(scratch, drain_rows))
        result["drain_rows"] = drain_rows
    finally:
        engine.dispose()
        scratch.drop()
    result["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
