"""Benchmark: the admin's overview (with its charts) and first stuck page on a big outbox.

Builds a scratch database (dropped afterwards) holding the example service's
tables, fills ``webhook_outbox`` with 10,000,000 done, 100,000 stuck and
1,000,000 pending rows (half due, half in backoff), 10,000 recorded drain
runs, an hour of attempt history (``--attempts`` rows, 60,000 by default)
and the hour's per-minute figures the drainers keep for the charts, all
with ``generate_series``, then ``VACUUM ANALYZE`` (what autovacuum would
have done by then).  Loading 10M rows takes minutes.  It times, through the
in-process ASGI client behind the example's HTTP Basic auth, the overview
page with its SVG charts (``overview_charts_p95_ms``), the overview API with
and without the charts' data, the charts' own read of the per-minute table
(``charts_query_p95_ms``), and the first page of stuck rows.

    python bench/admin_overview.py [--done 10000000] [--pending 1000000] [--stuck 100000] [--requests 200]

Server: ``OUTBOXKIT_BENCH_DATABASE_URL`` (a libpq URL of any database on a
server where the user may create databases), else 127.0.0.1:5432/test.
Target: p95 <= 100 ms for each.  The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.admin_app import create_app  # noqa: E402
from exampleapp.models import Base  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from outboxkit import OutboxKit  # noqa: E402
from outboxkit.operations.charts import last_hour  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

PASSWORD = "bench"

FILL = [
    # done: delivered long ago
    """INSERT INTO webhook_outbox (event, target_url, payload, status, attempts, last_status_code,
           next_attempt_at, created_at, updated_at, delivered_at)
       SELECT 'grant.created', 'http://127.0.0.1:9/hook', jsonb_build_object('n', g, 'note', repeat('x', 40)), 'done', 1, 200,
              now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
       FROM generate_series(1, %(done)s) AS g""",
    # stuck: a mix of errors, interleaved in time with the rest
    """INSERT INTO webhook_outbox (event, target_url, payload, status, attempts, last_status_code, last_error, next_attempt_at)
       SELECT 'grant.created', 'http://127.0.0.1:9/hook', jsonb_build_object('n', g), 'stuck', 1 + g %% 24,
              CASE WHEN g %% 3 = 0 THEN 400 WHEN g %% 3 = 1 THEN 422 END,
              CASE WHEN g %% 3 = 2 THEN 'max attempts (24) reached: timeout after 10s'
                   ELSE 'receiver answered ' || (400 + 22 * (g %% 3)) || ': bad amount' END,
              now() - g * interval '1 second'
       FROM generate_series(1, %(stuck)s) AS g""",
    # pending: half due (a backlog), half in backoff
    """INSERT INTO webhook_outbox (event, target_url, payload, status, attempts, next_attempt_at)
       SELECT 'grant.created', 'http://127.0.0.1:9/hook', jsonb_build_object('n', g), 'pending', g %% 5,
              now() + CASE WHEN g %% 2 = 0 THEN g * interval '1 second' ELSE -g * interval '1 second' END
       FROM generate_series(1, %(pending)s) AS g""",
    """INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, leader)
       SELECT 'outboxkit.drain.' || CASE WHEN g %% 2 = 0 THEN 'webhooks' ELSE 'credit-grants' END, 'drain',
              now() - g * interval '1 minute', now() - g * interval '1 minute', now() - g * interval '1 minute', 'ok',
              '{"delivered": 50}', 'bench:1'
       FROM generate_series(1, 10000) AS g""",
    # the last hour's attempts, spread evenly over the hour, a tenth of them failed
    """INSERT INTO outboxkit_attempts (outbox, row_id, attempt, started_at, finished_at, outcome, status_code, error, sender)
       SELECT 'webhooks', g, 1, now() - (g %% 3600) * interval '1 second' - interval '20 milliseconds',
              now() - (g %% 3600) * interval '1 second', CASE WHEN g %% 10 = 0 THEN 'retry' ELSE 'done' END,
              CASE WHEN g %% 10 = 0 THEN 503 ELSE 200 END, CASE WHEN g %% 10 = 0 THEN 'receiver answered 503' END, 'bench:1'
       FROM generate_series(1, %(attempts)s) AS g""",
    # the hour's per-minute figures, as the drainers keep them (both outboxes)
    """INSERT INTO outboxkit_outbox_minutes (outbox, minute, delivered, failed, stuck, pending, due, oldest_due_seconds)
       SELECT outbox, date_trunc('minute', now(), 'UTC') - m * interval '1 minute', 900 + m, 100 - m, m %% 3,
              %(pending)s + m * 10, %(pending)s / 2 + m * 5, 60 + m * 30
       FROM generate_series(0, 59) AS m, (VALUES ('webhooks'), ('credit-grants')) AS boxes(outbox)""",
]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def time_requests(client: TestClient, path: str, count: int) -> list[float]:
    for _ in range(10):  # warm the pool, the statement caches and the planner
        assert client.get(path).status_code == 200
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    return samples


def time_charts_query(kit: OutboxKit, count: int) -> list[float]:
    """The charts' own share: the one read of outboxkit_outbox_minutes the overview adds."""
    names = [outbox.__outbox__.job_name for outbox in kit.outboxes]
    samples = []
    with kit.engine.connect() as connection:
        for index in range(count + 10):
            started = time.perf_counter()
            last_hour(connection, names, now=datetime.now(timezone.utc))
            if index >= 10:  # the first ones warm the plan cache
                samples.append((time.perf_counter() - started) * 1000)
    return samples


@contextmanager
def example_database(purpose: str) -> Iterator[str]:
    """A scratch database with the example service's and the kit's tables; its libpq URL.  Dropped at the end.

    On ``OUTBOXKIT_BENCH_DATABASE_URL``'s server, else 127.0.0.1:5432 (shared with ``bench/admin_isolation.py``).
    """
    server = os.environ.get("OUTBOXKIT_BENCH_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test")
    scratch = f"outboxkit_bench_{purpose}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch}"')
    url = make_url(server).set(database=scratch).render_as_string(hide_password=False)
    try:
        engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
        try:
            Base.metadata.create_all(engine)
            kit_metadata.create_all(engine)
        finally:
            engine.dispose()
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--done", type=int, default=10_000_000)
    parser.add_argument("--stuck", type=int, default=100_000)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--attempts", type=int, default=60_000, help="attempt history rows in the last hour")
    parser.add_argument("--requests", type=int, default=200)
    arguments = parser.parse_args()

    with example_database("admin") as url:
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as connection:
            for statement in FILL:
                sizes = {
                    "done": arguments.done,
                    "stuck": arguments.stuck,
                    "pending": arguments.pending,
                    "attempts": arguments.attempts,
                }
                connection.execute(statement, sizes)
            connection.execute("VACUUM ANALYZE")
        print(
            f"filled {arguments.done:,} done, {arguments.stuck:,} stuck, {arguments.pending:,} pending "
            f"in {time.perf_counter() - started:.1f}s"
        )

        app = create_app(url, admin_password=PASSWORD, pool_size=2)
        with TestClient(app) as client:
            client.auth = ("admin", PASSWORD)
            overview = client.get("/admin/api/outboxes").json()
            webhooks = next(box for box in overview["outboxes"] if box["name"] == "webhooks")
            print("overview counts:", json.dumps(webhooks["counts"]))
            page = client.get("/admin/").text
            assert page.count('<svg class="chart ') == 8, "the overview page should draw four charts per outbox"
            charts_samples = time_requests(client, "/admin/", arguments.requests)
            charts_api_samples = time_requests(client, "/admin/api/outboxes?charts=true", arguments.requests)
            overview_samples = time_requests(client, "/admin/api/outboxes", arguments.requests)
            charts_query_samples = time_charts_query(app.state.outboxkit, arguments.requests)
            stuck_samples = time_requests(client, "/admin/api/outboxes/webhooks/rows?status=stuck&limit=50", arguments.requests)

    result = {
        "overview_charts_p50_ms": round(statistics.median(charts_samples), 2),
        "overview_charts_p95_ms": round(percentile(charts_samples, 0.95), 2),
        "overview_charts_api_p95_ms": round(percentile(charts_api_samples, 0.95), 2),
        "charts_query_p95_ms": round(percentile(charts_query_samples, 0.95), 2),
        "overview_p50_ms": round(statistics.median(overview_samples), 2),
        "overview_p95_ms": round(percentile(overview_samples, 0.95), 2),
        "stuck_page_p50_ms": round(statistics.median(stuck_samples), 2),
        "stuck_page_p95_ms": round(percentile(stuck_samples, 0.95), 2),
        "requests": arguments.requests,
        "done_rows": arguments.done,
        "stuck_rows": arguments.stuck,
        "pending_rows": arguments.pending,
        "attempt_rows": arguments.attempts,
    }
    target_met = all(result[key] <= 100 for key in ("overview_charts_p95_ms", "overview_p95_ms", "stuck_page_p95_ms"))
    print(f"target p95 <= 100 ms: {'met' if target_met else 'NOT met'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
