"""What listing destinations costs the operator: every destination's state with its rows waiting.

Against a real PostgreSQL (a scratch database it creates and drops) and the
example ``WebhookOutbox``: ``--destinations`` destinations with an open
breaker, each holding ``--held`` rows back, beside ``--other`` pending rows
spread over the next day.  It reads them as the admin's Destinations page,
the JSON API, the CLI and the metrics do (``destination_queries.destination_views``:
the states, then every destination's capped count of rows waiting in one
statement) and reports the best of ``--rounds`` in wall and CPU milliseconds,
and whether the count reads the outbox's due index (``EXPLAIN``)::

    .venv/bin/python bench/destinations_admin.py

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from outboxkit.breaker import BreakerOptions, Reading, Signal  # noqa: E402
from outboxkit.destinations.store import DestinationStore, Observation  # noqa: E402
from outboxkit.destinations.views import destination_views  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

CAP = 10_000  # as the admin counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destinations", type=int, default=200)
    parser.add_argument("--held", type=int, default=50, help="rows each destination holds back")
    parser.add_argument("--other", type=int, default=190_000, help="other pending rows, spread over a day")
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()

    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=2)
    try:
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)
        now = datetime.now(timezone.utc).replace(microsecond=0)
        store = DestinationStore(WebhookOutbox)
        with engine.begin() as connection:
            for index in range(arguments.destinations):
                at = now + timedelta(microseconds=index + 1)  # distinct hold instants, none on a whole second
                store.record(connection, f"http://partner-{index}.example:80",
                             [Observation(Reading(Signal.FAILURE), 1, None, "timeout")], now=at,
                             options=BreakerOptions(failures=1))
            connection.execute(
                text("INSERT INTO webhook_outbox (event, target_url, payload, next_attempt_at) "
                     "SELECT 'e', 'http://other.example/', '{}', :now + (g % 86400) * interval '1 second' "
                     "FROM generate_series(1, :count) AS g"),
                {"now": now, "count": arguments.other},
            )
            for state in store.all_states(connection):
                connection.execute(
                    text("INSERT INTO webhook_outbox (event, target_url, destination, payload, next_attempt_at) "
                         "SELECT 'e', 'http://held.example/', :destination, '{}', :now FROM generate_series(1, :count)"),
                    {"destination": state.destination, "now": now, "count": arguments.held},
                )
            connection.execute(text("ANALYZE webhook_outbox"))
        walls, cpus = [], []
        with engine.connect() as connection:
            for _ in range(arguments.rounds):
                wall, cpu = time.perf_counter(), time.process_time()
                views = destination_views(connection, WebhookOutbox, now=now, cap=CAP)
                walls.append((time.perf_counter() - wall) * 1000)
                cpus.append((time.process_time() - cpu) * 1000)
            held = views[0].state.destination
            plan = "\n".join(connection.execute(
                text("EXPLAIN SELECT count(*) FROM (SELECT 1 FROM webhook_outbox WHERE status = 'pending' "
                     "AND destination = :destination LIMIT 10001) AS capped"), {"destination": held}
            ).scalars())
        counted = sum(view.waiting_rows for view in views)
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE "{scratch.name}"')
    print(plan)
    print(json.dumps({
        "destinations": len(views),
        "rows_waiting_counted": counted,
        "rows_waiting_expected": arguments.destinations * arguments.held,
        "pending_rows": arguments.other + arguments.destinations * arguments.held,
        "list_wall_ms_best": round(min(walls), 1),
        "list_cpu_ms_best": round(min(cpus), 1),
        "count_uses_due_index": "ix_webhook_outbox_due_id" in plan,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }))


if __name__ == "__main__":
    main()
