"""Benchmark: the schedules list's first page with 10,000 schedule rows (operator layer and JSON API).

Builds a scratch database (dropped afterwards) with the kit's tables and
``--schedules`` rows (10,000 by default): half ``cron(hour=3, minute=30)``
in Europe/Berlin, half ``every(seconds=60)`` in UTC, each with one recorded
run in ``outboxkit_job_runs`` (the list shows each schedule's last run).
It times, each the median (and p95) of ``--repeats`` calls after a warm-up, the five interleaved:

* ``schedules_list_page_ms``: ``ScheduleAdmin.overview()``, the first page
  at the default size (50), with each schedule's next five fire times in
  its zone and the viewer's (America/New_York) and its last run;
* ``schedules_list_page_200_ms``: the same at the largest page size (200);
* ``schedules_list_deep_page_ms``: a page near the end of the list (a
  cursor after the 9,950th name): keyset paging costs what the first page
  costs;
* ``schedules_api_page_ms``, ``schedules_html_page_ms``: ``GET
  /api/schedules`` and the ``/schedules`` page through the admin router
  in-process (JSON encoding, the template), the first page of 50;
* ``schedules_list_all_ms`` (with ``--all``, once): every schedule's fire
  times and last run computed in one call, as the list did before it was
  paged (the issue measured 53 s for it).

    python bench/schedules_list.py [--schedules 10000] [--repeats 20] [--all]

Server: ``DATABASE_URL`` (a libpq URL on a server where the user may create
databases), else 127.0.0.1:5432/test.  ``load`` is the host's 1-minute load
average at the end.  The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from bench.schedules import insert_schedules  # noqa: E402
from outboxkit import OutboxKit, OutboxKitSettings  # noqa: E402
from outboxkit.admin import create_admin_router  # noqa: E402
from outboxkit.operations.cursor import encode_cursor  # noqa: E402
from outboxkit.operations.schedule_admin import ScheduleAdmin  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

VIEWER = "America/New_York"
CRON_HALF = """
UPDATE outboxkit_schedules SET trigger_kind = 'cron', trigger_fields = '{"hour": 3, "minute": 30}',
       timezone = 'Europe/Berlin'
WHERE id % 2 = 0"""
ONE_RUN_EACH = """
INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, leader)
SELECT name, name, now() - interval '1 minute', now() - interval '1 minute', now() - interval '59 seconds', 'ok',
       '{}', 'bench:1:abcd'
FROM outboxkit_schedules"""


def timed(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds of ``repeats`` rounds, each calling every one of ``calls`` once in turn (interleaved, so
    a change in the host's load touches them alike), after three warm-up rounds."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for round_number in range(3 + repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            if round_number >= 3:
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def median(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 2)


def run(args: argparse.Namespace) -> dict[str, object]:
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=4, max_overflow=0)
    try:
        kit_metadata.create_all(engine)
        Base.metadata.create_all(engine)
        # grace=300: the misfire grace a schedule gets when it names none (the column's default).
        insert_schedules(engine, args.schedules, 60.0, datetime.now(timezone.utc) + timedelta(hours=1), grace=300)
        with engine.begin() as connection:
            connection.execute(text(CRON_HALF))
            connection.execute(text(ONE_RUN_EACH))
            connection.execute(text("ANALYZE outboxkit_schedules"))
            connection.execute(text("ANALYZE outboxkit_job_runs"))
            names = list(connection.execute(text("SELECT name FROM outboxkit_schedules ORDER BY name")).scalars())
        kit = OutboxKit(engine, [WebhookOutbox], settings=OutboxKitSettings(listen_enabled=False))
        try:
            admin = ScheduleAdmin(kit)
            first = admin.overview(viewer_timezone=VIEWER)
            assert len(first.schedules) == 50 and all(len(entry.next_fire_times) == 5 for entry in first.schedules)
            deep = encode_cursor("schedules", (names[max(0, len(names) - 50)],))
            app = FastAPI()
            app.include_router(create_admin_router(kit, insecure_no_auth=True, csrf_secret="bench-csrf-secret"))
            with TestClient(app) as client:
                samples = timed(
                    {
                        "page": lambda: admin.overview(viewer_timezone=VIEWER),
                        "page_200": lambda: admin.overview(viewer_timezone=VIEWER, limit=200),
                        "deep_page": lambda: admin.overview(viewer_timezone=VIEWER, cursor=deep),
                        "api_page": lambda: client.get(
                            "/api/schedules", params={"viewer_timezone": VIEWER}
                        ).raise_for_status(),
                        "html_page": lambda: client.get("/schedules", params={"tz": VIEWER}).raise_for_status(),
                    },
                    args.repeats,
                )
            result: dict[str, object] = {
                "schedules": args.schedules,
                "schedules_list_page_ms": median(samples["page"]),
                "schedules_list_page_p95_ms": p95(samples["page"]),
                "schedules_list_page_200_ms": median(samples["page_200"]),
                "schedules_list_deep_page_ms": median(samples["deep_page"]),
                "schedules_api_page_ms": median(samples["api_page"]),
                "schedules_html_page_ms": median(samples["html_page"]),
            }
            if args.all:
                started = time.perf_counter()
                cursor = None
                while True:  # every page at the largest size: every schedule's fire times, as the unpaged list did
                    view = admin.overview(viewer_timezone=VIEWER, cursor=cursor, limit=200)
                    cursor = view.next_cursor
                    if cursor is None:
                        break
                result["schedules_list_all_ms"] = round((time.perf_counter() - started) * 1000, 1)
        finally:
            kit.close()
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
    result["load"] = round(os.getloadavg()[0], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="also time every schedule's fire times (the unpaged list)")
    args = parser.parse_args()
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
