"""Growth: no cliffs as the outbox table grows.

In a scratch database it creates on the test server (``server_url()`` from
tests/support/database.py) and drops at the end, with the example service's
``webhook_outbox``, every table filled in SQL with ``generate_series``:

1. **claim**: ``--claim-rows`` due rows (default 1,000,000), first each with
   its own ``next_attempt_at``, then all sharing one (one INSERT, one
   ``now()``: a bulk enqueue); ``VACUUM ANALYZE``; the drain's real
   ``CLAIM_DUE_ROWS`` statement (batch of 50) timed ``--repeat`` times, each
   claim rolled back so every run sees the same table.  The key figure is the
   median round trip of the statement; the server's own execution time
   (``EXPLAIN (ANALYZE, TIMING OFF)``) is printed beside it, since on a
   shared host the round trip includes waiting for a CPU;
2. **drain**: ``--drain-rows`` due rows (default 100,000) with distinct due
   times, drained by a real drainer process (``bench/drain_worker.py``, an
   ``OutboxKit.drain`` loop) against the fast local receiver
   (``bench/receiver.py``); then as many ``stuck`` rows put back by the
   admin's bulk reset (``AdminQueries.reset_stuck_batch`` in batches of 1,000,
   as the admin runs it, with one ``now`` on every row) and drained the same way;
3. **overview**: ``--done-rows`` done rows (default 10,000,000), ``--pending-rows``
   pending (default 1,000,000: half due, half in backoff, 1,000 in flight) and
   10,000 stuck; ``VACUUM ANALYZE``; the admin's overview API
   (``GET /admin/api/outboxes``, in-process ASGI client) and
   ``AdminQueries.status_counts`` timed ``--repeat`` times;
4. **retention**, on that table: the done rows' delivery times spread over
   ten days, one run of ``delete_delivered_rows`` with the default limits and a
   nine-day cutoff (timed), and a second run right after (the steady state:
   nothing old left); then the cost an index on ``delivered_at`` would add to
   every delivery, as outcome writes per second (``RECORD_OUTCOME``, one row
   per transaction) with and without it;
5. **hot**: how many of the claim and outcome updates are HOT (no index
   entry written), at fillfactor 100 and 70.

``--legacy-due-index`` measures the schema before this change: the due index
on ``next_attempt_at`` alone, no in-flight index, and (for the overview) the
former counting statement.

    .venv/bin/python bench/growth.py                       # the default sizes, ~10 minutes
    .venv/bin/python bench/growth.py --claim-rows 100000 --drain-rows 10000 --done-rows 500000 --pending-rows 100000

The last line printed is one JSON object.  Targets: ``claim_ms_same_time_1m``
<= 2, ``drain_rows_per_s_after_bulk_reset_100k`` >= 0.8 of
``drain_rows_per_s_distinct_100k``, ``overview_ms_10m_done_1m_pending`` (p95)
<= 100.
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
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench.drain_throughput import ReceiverProcess, run_drainer  # noqa: E402
from outboxkit.leader.retention import RetentionLimits, delete_delivered_rows  # noqa: E402
from outboxkit.storage.drain_queries import claim_sql, rate_parameters, record_outcome_sql  # noqa: E402
from outboxkit.storage.operator_queries import admin_queries_for  # noqa: E402
from outboxkit.storage.row_filter import RowFilter  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402
from tests.support.database import server_url  # noqa: E402

TABLE = WebhookOutbox.__tablename__
OUTBOX_TABLES = ("credit_grant_outbox", "webhook_outbox")
PASSWORD = "bench"
# The drain's claim with psycopg's parameter style; RETURNING outbox.* kept, as the drain reads it.
CLAIM = re.sub(r"(?<!:):(\w+)", r"%(\1)s", claim_sql(TABLE))
# The claim walks destinations from a cursor and caps a suspect one: this table's rows share one destination.
CLAIM_SCOPE = {"outbox": "webhooks", "after": None, "cap": 50, "unknown_suspect": True, "steps": 200, "probes": 1,
               **rate_parameters(None)}
RECORD = record_outcome_sql(TABLE)
# The overview's counts before this change (outboxkit/storage/drain_queries.py at 0670ce2): exact counts.
LEGACY_STATUS_COUNTS = f"""
SELECT (SELECT count(*) FROM {TABLE} WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM {TABLE} WHERE status = 'pending' AND claimed_until > %(now)s) AS in_flight,
       (SELECT count(*) FROM {TABLE} WHERE status = 'stuck') AS stuck,
       (SELECT min(next_attempt_at) FROM {TABLE} WHERE status = 'pending' AND next_attempt_at <= %(now)s) AS oldest_due_at,
       (SELECT reltuples FROM pg_class WHERE oid = to_regclass('{TABLE}')) AS total_estimate
"""
ROW_VALUES = "'bench.event', %(url)s, jsonb_build_object('n', g)"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def timed(function: Callable[[], object], repeat: int, warm: int = 5) -> list[float]:
    """Milliseconds per call, ``repeat`` calls after ``warm`` unmeasured ones."""
    for _ in range(warm):
        function()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples):.2f} ms, p95 {percentile(samples, 0.95):.2f} ms, max {max(samples):.2f} ms"


class Scratch:
    """The scratch database: its URLs and a few maintenance statements."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.name = f"outboxkit_bench_growth_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.url = make_url(server).set(database=self.name).render_as_string(hide_password=False)
        self.sqlalchemy_url = make_url(self.url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)

    def create(self, *, legacy: bool) -> None:
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{self.name}"')
        engine = create_engine(self.sqlalchemy_url)
        try:
            Base.metadata.create_all(engine)
            kit_metadata.create_all(engine)
        finally:
            engine.dispose()
        if legacy:
            with self.connect() as connection:
                for table in OUTBOX_TABLES:
                    connection.execute(f"DROP INDEX ix_{table}_due_id")
                    connection.execute(f"DROP INDEX ix_{table}_claimed")
                    connection.execute(f"CREATE INDEX ix_{table}_due ON {table} (next_attempt_at) WHERE status = 'pending'")

    def drop(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True)

    def refill(self, *statements: tuple[str, dict[str, object]]) -> None:
        """Empty the outbox, run the fill statements, then ``VACUUM ANALYZE`` (what autovacuum would do by then)."""
        with self.connect() as connection:
            connection.execute(f"TRUNCATE {TABLE}")
            for statement, parameters in statements:
                connection.execute(statement, parameters)
            connection.execute(f"VACUUM ANALYZE {TABLE}")


def due_rows(count: int, *, url: str = "http://127.0.0.1:9/hook", same_time: bool) -> tuple[str, dict[str, object]]:
    """An INSERT of ``count`` due rows, each with its own due time or all with one."""
    due = "now() - interval '1 hour'" if same_time else "now() - interval '2 hours' + g * interval '1 millisecond'"
    return (
        f"INSERT INTO {TABLE} (event, target_url, payload, next_attempt_at) "
        f"SELECT {ROW_VALUES}, {due} FROM generate_series(1, %(count)s) AS g",
        {"count": count, "url": url},
    )


# -- 1. the claim ----------------------------------------------------------------


def time_claims(scratch: Scratch, repeat: int) -> tuple[list[float], list[float]]:
    """Milliseconds per claim as the drainer sees it (the statement's round trip; the rollback after it is
    not counted) and as the server spent them (``EXPLAIN (ANALYZE, TIMING OFF)``'s execution time)."""
    client, server = [], []
    with psycopg.connect(scratch.url) as connection:
        for number in range(repeat + 5):  # the first five warm the caches
            now = datetime.now(timezone.utc)
            parameters = {"now": now, "lease_until": now + timedelta(minutes=5), "limit": 50, "token": uuid.uuid4(),
                          **CLAIM_SCOPE}
            started = time.perf_counter()
            rows = connection.execute(CLAIM, parameters).fetchall()
            elapsed = (time.perf_counter() - started) * 1000
            connection.rollback()  # every claim sees the same table
            if len(rows) != 50:
                raise RuntimeError(f"the claim returned {len(rows)} rows, expected 50")
            explained = connection.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + CLAIM, parameters).fetchone()
            assert explained is not None  # EXPLAIN returns one row
            plan = explained[0]
            connection.rollback()
            if number >= 5:
                client.append(elapsed)
                server.append(plan[0]["Execution Time"])
    return client, server


def measure_claims(scratch: Scratch, rows: int, repeat: int) -> dict[str, float]:
    results = {}
    for label, same_time in (("distinct", False), ("same_time", True)):
        started = time.perf_counter()
        scratch.refill(due_rows(rows, same_time=same_time))
        client, server = time_claims(scratch, repeat)
        print(
            f"claim, {rows:,} due rows, {label.replace('_', ' ')} due times (filled in {time.perf_counter() - started:.1f} s): "
            f"{summary(client)}; server execution time {summary(server)}"
        )
        results[label] = statistics.median(client)
        results[f"{label}_server"] = statistics.median(server)
    return results


# -- 2. the drain ----------------------------------------------------------------


def measure_drains(scratch: Scratch, rows: int) -> dict[str, float]:
    receiver = ReceiverProcess()
    try:
        target = f"{receiver.url}/events"
        scratch.refill(due_rows(rows, url=target, same_time=False))
        distinct = run_drainer(scratch.sqlalchemy_url, scratch.server, scratch.name, expected=rows, concurrency=None)
        print(
            f"drain, {rows:,} rows with distinct due times: {distinct.rows_per_s:.0f} rows/s "
            f"({distinct.report['elapsed_s']:.1f} s, counts {distinct.report['counts']})"
        )
        receiver.reset()

        stuck = (
            f"INSERT INTO {TABLE} (event, target_url, payload, status, attempts, last_status_code, last_error, next_attempt_at) "
            f"SELECT {ROW_VALUES}, 'stuck', 24, 503, 'max attempts (24) reached', now() - g * interval '1 second' "
            "FROM generate_series(1, %(count)s) AS g"
        )
        scratch.refill((stuck, {"count": rows, "url": target}))
        engine = create_engine(scratch.sqlalchemy_url, pool_size=1)
        reset: list[int] = []
        now = datetime.now(timezone.utc)
        try:
            while True:
                with engine.begin() as connection:
                    batch = admin_queries_for(WebhookOutbox).reset_stuck_batch(
                        connection, RowFilter(), after_id=reset[-1] if reset else 0, limit=1_000, now=now
                    )
                reset += batch
                if len(batch) < 1_000:
                    break
        finally:
            engine.dispose()
        if len(reset) != rows:
            raise RuntimeError(f"the bulk reset touched {len(reset)} rows, expected {rows}")
        with scratch.connect() as connection:
            connection.execute(f"VACUUM ANALYZE {TABLE}")
        after_reset = run_drainer(scratch.sqlalchemy_url, scratch.server, scratch.name, expected=rows, concurrency=None)
        print(
            f"drain, {rows:,} rows after one bulk reset (one due time): {after_reset.rows_per_s:.0f} rows/s "
            f"({after_reset.report['elapsed_s']:.1f} s, counts {after_reset.report['counts']})"
        )
    finally:
        receiver.stop()
    return {"distinct": distinct.rows_per_s, "after_bulk_reset": after_reset.rows_per_s}


# -- 3. the overview -------------------------------------------------------------


def fill_big_table(scratch: Scratch, *, done: int, pending: int) -> None:
    """``done`` delivered rows over ten days, ``pending`` (half due, half in backoff, 1,000 in flight), 10,000 stuck."""
    constraint = f"uq_{TABLE}_idempotency_key"
    statements: list[tuple[str, dict[str, object]]] = [
        # Random UUIDs into a 10M-entry unique index one by one cost minutes; one sorted build after the load does not.
        (f"ALTER TABLE {TABLE} DROP CONSTRAINT {constraint}", {}),
        (
            f"INSERT INTO {TABLE} (event, target_url, payload, status, attempts, last_status_code, "
            "next_attempt_at, created_at, updated_at, delivered_at) "
            f"SELECT {ROW_VALUES}, 'done', 1, 200, at, at, at, at "
            "FROM (SELECT g, now() - interval '10 days' + g * (interval '10 days' / %(count)s) AS at "
            "      FROM generate_series(1, %(count)s) AS g) AS spread",
            {"count": done, "url": "http://127.0.0.1:9/hook"},
        ),
        (
            f"INSERT INTO {TABLE} (event, target_url, payload, status, attempts, last_status_code, last_error, next_attempt_at) "
            f"SELECT {ROW_VALUES}, 'stuck', 24, 503, 'max attempts (24) reached', now() - g * interval '1 second' "
            "FROM generate_series(1, 10000) AS g",
            {"url": "http://127.0.0.1:9/hook"},
        ),
        (
            f"INSERT INTO {TABLE} (event, target_url, payload, attempts, next_attempt_at, claimed_until, claim_token) "
            f"SELECT {ROW_VALUES}, 1 + g %% 5, "
            "CASE WHEN g <= 1000 THEN now() + interval '10 minutes' "
            "     WHEN g %% 2 = 0 THEN now() + g * interval '1 second' ELSE now() - g * interval '1 millisecond' END, "
            "CASE WHEN g <= 1000 THEN now() + interval '10 minutes' END, CASE WHEN g <= 1000 THEN gen_random_uuid() END "
            "FROM generate_series(1, %(count)s) AS g",
            {"count": pending, "url": "http://127.0.0.1:9/hook"},
        ),
        (f"ALTER TABLE {TABLE} ADD CONSTRAINT {constraint} UNIQUE (idempotency_key)", {}),
    ]
    started = time.perf_counter()
    with scratch.connect() as connection:
        connection.execute("SET maintenance_work_mem = '256MB'")
        connection.execute(f"TRUNCATE {TABLE}")
        for statement, parameters in statements:
            connection.execute(statement, parameters)
        connection.execute(f"VACUUM ANALYZE {TABLE}")
    print(f"filled {done:,} done, {pending:,} pending and 10,000 stuck rows in {time.perf_counter() - started:.0f} s")


def measure_overview(scratch: Scratch, repeat: int, *, legacy: bool) -> dict[str, float]:
    if legacy:
        with psycopg.connect(scratch.url, autocommit=True) as legacy_connection:
            samples = timed(
                lambda: legacy_connection.execute(LEGACY_STATUS_COUNTS, {"now": datetime.now(timezone.utc)}).fetchall(), repeat
            )
        print(f"overview counts, the former statement (exact counts, no in-flight index): {summary(samples)}")
        return {"overview": percentile(samples, 0.95)}

    from exampleapp.admin_app import create_app
    from fastapi.testclient import TestClient

    engine = create_engine(scratch.sqlalchemy_url, pool_size=1)
    queries = admin_queries_for(WebhookOutbox)
    try:
        with engine.connect() as connection:
            counts = queries.status_counts(connection, now=datetime.now(timezone.utc))
            print(f"status counts: {counts}")
            counted = timed(lambda: queries.status_counts(connection, now=datetime.now(timezone.utc)), repeat)
    finally:
        engine.dispose()
    print(f"AdminQueries.status_counts (webhooks): {summary(counted)}")
    app = create_app(scratch.sqlalchemy_url, admin_password=PASSWORD, pool_size=2)
    with TestClient(app) as client:
        client.auth = ("admin", PASSWORD)

        def overview() -> None:
            response = client.get("/admin/api/outboxes")
            if response.status_code != 200:
                raise RuntimeError(f"the overview answered {response.status_code}: {response.text}")

        samples = timed(overview, repeat)
    print(f"GET /admin/api/outboxes (2 outboxes, leader, last drain runs): {summary(samples)}")
    return {"overview": percentile(samples, 0.95), "status_counts": percentile(counted, 0.95)}


# -- 4. retention ----------------------------------------------------------------


def measure_retention(scratch: Scratch, done: int, outcome_rows: int) -> dict[str, float]:
    engine = create_engine(scratch.sqlalchemy_url, pool_size=1)
    try:
        cutoff = datetime.now(timezone.utc) - timedelta(days=9)
        limits = RetentionLimits()
        deleted, runs, started = 0, 0, time.perf_counter()
        while True:  # the backlog of a first enable: as many runs as the per-run limit needs
            count = delete_delivered_rows(engine, WebhookOutbox, older_than=cutoff, limits=limits)
            deleted, runs = deleted + count, runs + 1
            if count < limits.max_rows:
                break
        elapsed = time.perf_counter() - started
        started = time.perf_counter()
        again = delete_delivered_rows(engine, WebhookOutbox, older_than=cutoff, limits=limits)
        steady_ms = (time.perf_counter() - started) * 1000
    finally:
        engine.dispose()
    print(
        f"retention, nine-day cutoff on {done:,} done rows over ten days: deleted {deleted:,} in {runs} run(s), "
        f"{elapsed:.1f} s ({deleted / elapsed:.0f} rows/s, batches of {limits.batch_size}, run limit {limits.max_rows:,}); "
        f"the next run (nothing old left) deleted {again} in {steady_ms:.1f} ms"
    )

    rates = {}
    for label, extra_index in (("without", False), ("with", True)):
        statements = [due_rows(outcome_rows, same_time=False)]
        with scratch.connect() as connection:
            connection.execute(f"DROP INDEX IF EXISTS ix_{TABLE}_delivered")
            if extra_index:
                connection.execute(f"CREATE INDEX ix_{TABLE}_delivered ON {TABLE} (delivered_at) WHERE status = 'done'")
        scratch.refill(*statements)
        rates[label] = outcome_writes_per_second(scratch, outcome_rows)
        print(
            f"outcome writes (RECORD_OUTCOME to done, one row per transaction) {label} an index on delivered_at: "
            f"{rates[label]:.0f} rows/s"
        )
    return {
        "rows_per_s": deleted / elapsed,
        "deleted": deleted,
        "steady_ms": steady_ms,
        "outcomes_without_index": rates["without"],
        "outcomes_with_index": rates["with"],
    }


def outcome_writes_per_second(scratch: Scratch, rows: int) -> float:
    """Claim every row with the real claim (in batches of 50), then time one RECORD_OUTCOME per row."""
    claimed: list[tuple[int, uuid.UUID]] = []
    with psycopg.connect(scratch.url) as connection:
        while True:
            now, token = datetime.now(timezone.utc), uuid.uuid4()
            cursor = connection.execute(
                CLAIM, {"now": now, "lease_until": now + timedelta(hours=1), "limit": 50, "token": token, **CLAIM_SCOPE}
            )
            assert cursor.description is not None  # a statement with RETURNING describes its columns
            id_column = [column.name for column in cursor.description].index("id")  # RETURNING outbox.*
            ids = [row[id_column] for row in cursor]
            connection.commit()
            if not ids:
                break
            claimed += [(row_id, token) for row_id in ids]
    with scratch.connect() as connection:
        started = time.perf_counter()
        for row_id, token in claimed:
            now = datetime.now(timezone.utc)
            connection.execute(
                RECORD,
                {
                    "id": row_id,
                    "token": token,
                    "status": "done",
                    "next_attempt_at": None,
                    "delivered_at": now,
                    "status_code": 200,
                    "error": None,
                    "now": now,
                },
                prepare=True,
            )
        return len(claimed) / (time.perf_counter() - started)


# -- 5. HOT updates and fillfactor ------------------------------------------------


def measure_hot_updates(scratch: Scratch, rows: int) -> dict[str, float]:
    """Share of the claim and outcome updates that were HOT, at fillfactor 100 and 70."""
    shares = {}
    for fillfactor in (100, 70):
        with scratch.connect() as connection:
            connection.execute(f"ALTER TABLE {TABLE} SET (fillfactor = {fillfactor})")
        scratch.refill(due_rows(rows, same_time=False))  # TRUNCATE: the new fillfactor applies to every page
        with scratch.connect() as connection:
            connection.execute("SELECT pg_stat_reset_single_table_counters(%s::regclass)", (TABLE,))
        outcome_writes_per_second(scratch, rows)
        with scratch.connect() as connection:
            connection.execute("SELECT pg_stat_force_next_flush()")
        with scratch.connect() as connection:  # a new backend: reads the flushed counters
            counters = connection.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", (TABLE,)
            ).fetchone()
            assert counters is not None  # the outbox's own row of pg_stat_user_tables
            updated, hot = counters
        shares[fillfactor] = hot / updated if updated else 0.0
        print(
            f"fillfactor {fillfactor}: {updated:,} updates (claim + outcome of {rows:,} rows), "
            f"{hot:,} HOT ({shares[fillfactor]:.1%})"
        )
    with scratch.connect() as connection:
        connection.execute(f"ALTER TABLE {TABLE} RESET (fillfactor)")
    return {"hot_share_fillfactor_100": shares[100], "hot_share_fillfactor_70": shares[70]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="growth benchmark (see the module docstring)")
    parser.add_argument("--claim-rows", type=int, default=1_000_000)
    parser.add_argument("--drain-rows", type=int, default=100_000)
    parser.add_argument("--done-rows", type=int, default=10_000_000)
    parser.add_argument("--pending-rows", type=int, default=1_000_000)
    parser.add_argument("--outcome-rows", type=int, default=20_000, help="rows per outcome-write measurement")
    parser.add_argument("--repeat", type=int, default=100, help="timed claims and overviews per measurement")
    parser.add_argument("--legacy-due-index", action="store_true", help="measure the schema before this change")
    parser.add_argument("--skip", action="append", default=[], choices=["claim", "drain", "overview", "retention", "hot"])
    arguments = parser.parse_args(argv)
    if (
        min(arguments.claim_rows, arguments.drain_rows, arguments.pending_rows, arguments.outcome_rows) < 1000
        or arguments.repeat < 1
    ):
        parser.error("row counts must be >= 1000 and --repeat >= 1")

    scratch = Scratch(server_url())
    scratch.create(legacy=arguments.legacy_due_index)
    print(
        f"database {scratch.name}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
        f"{'LEGACY due index (next_attempt_at alone), no in-flight index' if arguments.legacy_due_index else 'current indexes'}"
    )
    result: dict[str, float | int | bool | None] = {"legacy_due_index": arguments.legacy_due_index}
    try:
        if "claim" not in arguments.skip:
            claims = measure_claims(scratch, arguments.claim_rows, arguments.repeat)
            result.update(
                claim_ms_distinct_1m=round(claims["distinct"], 2),
                claim_ms_same_time_1m=round(claims["same_time"], 2),
                claim_server_ms_distinct_1m=round(claims["distinct_server"], 2),
                claim_server_ms_same_time_1m=round(claims["same_time_server"], 2),
            )
        if "drain" not in arguments.skip:
            drains = measure_drains(scratch, arguments.drain_rows)
            ratio = drains["after_bulk_reset"] / drains["distinct"]
            print(f"drain after bulk reset / distinct: {ratio:.2f} (target >= 0.8)")
            result.update(
                drain_rows_per_s_after_bulk_reset_100k=round(drains["after_bulk_reset"], 1),
                drain_rows_per_s_distinct_100k=round(drains["distinct"], 1),
                drain_ratio_after_bulk_reset=round(ratio, 3),
            )
        if "overview" not in arguments.skip or "retention" not in arguments.skip:
            fill_big_table(scratch, done=arguments.done_rows, pending=arguments.pending_rows)
        if "overview" not in arguments.skip:
            overview = measure_overview(scratch, arguments.repeat, legacy=arguments.legacy_due_index)
            result["overview_ms_10m_done_1m_pending"] = round(overview["overview"], 2)
            if "status_counts" in overview:
                result["status_counts_ms_10m_done_1m_pending"] = round(overview["status_counts"], 2)
        if "retention" not in arguments.skip:
            retention = measure_retention(scratch, arguments.done_rows, arguments.outcome_rows)
            result.update(
                retention_rows_per_s=round(retention["rows_per_s"], 1),
                retention_deleted_first_run=retention["deleted"],
                retention_steady_run_ms=round(retention["steady_ms"], 2),
                outcome_writes_per_s_without_delivered_index=round(retention["outcomes_without_index"], 1),
                outcome_writes_per_s_with_delivered_index=round(retention["outcomes_with_index"], 1),
            )
        if "hot" not in arguments.skip:
            hot = measure_hot_updates(scratch, arguments.outcome_rows)
            result.update({key: round(value, 4) for key, value in hot.items()})
    finally:
        scratch.drop()
    sizes = {
        "claim_rows": arguments.claim_rows,
        "drain_rows": arguments.drain_rows,
        "done_rows": arguments.done_rows,
        "pending_rows": arguments.pending_rows,
    }
    print(f"sizes: {sizes}; load average at the end {os.getloadavg()[0]:.2f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
