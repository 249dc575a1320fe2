"""The claim's cost with the database server's clock against the host's time bound as a parameter.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, with the example ``WebhookOutbox`` holding ``--rows`` pending rows
over ``--destinations`` destinations: the drain's claim statement as it ran
before (``:now`` and ``:lease_until`` bound from the host's clock) and as it
runs now (``COALESCE(CAST(:now AS timestamptz), now())``, ``:now`` bound to
NULL; ``outboxkit.storage.database_time``), each claiming ``--limit`` rows in
a transaction that is rolled back, interleaved A/B for ``--rounds`` rounds on
one connection.  The last line is one JSON object: each variant's median
milliseconds, their ratio (now / before; 1.0 means no cost) and the load
average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import Engine, insert, text  # noqa: E402
from sqlalchemy.dialects import postgresql  # noqa: E402

from bench.ceilings import scratch_engine  # noqa: E402
from outboxkit.storage.drain_queries import claim_sql, queries_for, quote_table  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def claim_times(engine: Engine, options: argparse.Namespace) -> dict[str, list[float]]:
    """Each claim form's times (ms), interleaved A/B on one connection, each claim rolled back."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    before_sql = str(text(claim_sql(quote_table(WebhookOutbox.__table__))).compile(dialect=dialect))
    now_sql = queries_for(WebhookOutbox)._claim_driver_sql
    common = {"limit": options.limit, "outbox": "webhooks", "after": None, "cap": 8, "unknown_suspect": False}
    times: dict[str, list[float]] = {"before": [], "now": []}
    with engine.connect() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        for round_number in range(options.rounds):
            for variant in ["before", "now"] if round_number % 2 == 0 else ["now", "before"]:
                if variant == "before":
                    host_now = datetime.now(timezone.utc)
                    sql = before_sql
                    params = {**common, "now": host_now, "lease_until": host_now + timedelta(seconds=60)}
                else:
                    sql, params = now_sql, {**common, "now": None, "lease_seconds": 60}
                started = time.perf_counter()
                claimed = driver.execute(sql, {**params, "token": uuid.uuid4()}).fetchall()
                times[variant].append((time.perf_counter() - started) * 1000)
                driver.rollback()
                assert len(claimed) == options.limit, (variant, len(claimed))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--destinations", type=int, default=20)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=300)
    options = parser.parse_args()
    with scratch_engine(Base.metadata, kit_metadata) as engine:
        with engine.begin() as connection:
            connection.execute(insert(WebhookOutbox), [
                {"event": "bench", "target_url": f"http://127.0.0.1:{9000 + n % options.destinations}/hook",
                 "payload": {"n": n}, "destination": f"http://127.0.0.1:{9000 + n % options.destinations}"}
                for n in range(options.rows)
            ])
            connection.execute(text("ANALYZE webhook_outbox"))
        times = claim_times(engine, options)
    before = statistics.median(times["before"])
    now = statistics.median(times["now"])
    print(json.dumps({
        "claim_ms_host_time_bound": round(before, 3),
        "claim_ms_database_time": round(now, 3),
        "claim_ms_ratio_database_to_host": round(now / before, 3),
        "rows": options.rows, "destinations": options.destinations, "limit": options.limit, "rounds": options.rounds,
        "load_average": load_average(),
    }))


if __name__ == "__main__":
    main()
