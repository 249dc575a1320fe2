"""Fan-out: what publishing an event to many subscriptions costs, and how fast its deliveries drain.

Against a real PostgreSQL (``DATABASE_URL``, else ``postgresql://root@127.0.0.1:5432/test``), in a scratch
database it creates and drops, with a receiver process (``bench/receiver.py``) on 127.0.0.1 (allow-listed):

1. ``publish_ms_1000_subscribers``: 1,000 enabled subscriptions of ``invoice.paid``; ``--publishes`` times, a
   transaction writes a business row, then ``publish`` writes the event and its 1,000 deliveries; the time of
   the ``publish`` call alone, inside the caller's transaction (p50 and p95; target p95 <= 25 ms), and of the
   commit after it (``publish_commit_ms``, reported);
2. ``fanout_delivery_rows_per_s``: ``--events`` events (1,000) to ``--subscribers`` subscriptions (100), so
   100,000 delivery rows, drained by the kit's drainer (signed per subscription, each URL checked by the guard),
   against the plain drain of the same number of rows of an ordinary outbox (the example ``WebhookOutbox``) on
   the same receiver, database and kit, in ``--rounds`` interleaved rounds; ``fanout_ratio`` is the median over
   the rounds of a round's fan-out rate over its plain rate (target >= 0.9).  Each delivery's destination is its
   subscription's own, as the kit writes it; ``fanout_ratio_host_destination`` is the same drain, in the same
   rounds, with every subscription on its host's one destination (the choice the kit does not make).

Run from the repository root::

    .venv/bin/python bench/fanout.py

The last line printed is one JSON object with the figures and the load average.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import Engine, create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.ceilings import insert_pending_rows, scratch_database, vacuum_analyze  # noqa: E402
from bench.latency import percentile  # noqa: E402
from outboxkit import EventDelivery, OutboxKit, OutboxKitSettings, publish  # noqa: E402
from outboxkit.breaker import destination_of  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"fan-out-benchmark-secret").decode()
SETTINGS = OutboxKitSettings(listen_enabled=False, url_allow_list=("127.0.0.1/32",))
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'admin'}"}


def subscribe(engine: Engine, count: int, url: str, event_type: str) -> None:
    """``count`` subscriptions written in one statement (benchmark set-up; the store checks each URL on save),
    each with its own destination as the store writes it (``subscription_destination``)."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outboxkit_subscriptions (url, event_types, secrets, created_by, changed_by) "
                "SELECT :url || '/s' || n, ARRAY[CAST(:type AS varchar)], ARRAY[CAST(:secret AS text)], 'bench', 'bench' "
                "FROM generate_series(1, :count) AS n"
            ),
            {"url": url, "type": event_type, "secret": SECRET, "count": count},
        )
    set_destinations(engine, url, per_subscription=True)


def set_destinations(engine: Engine, url: str, *, per_subscription: bool) -> None:
    """Every subscription's destination: its own (what the kit writes), or the host's (the A/B's other side)."""
    host = destination_of(url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE outboxkit_subscriptions SET destination = CASE WHEN :own THEN 'subscription ' || id || ': ' "
                 "|| CAST(:host AS text) ELSE CAST(:host AS text) END"),
            {"own": per_subscription, "host": host},
        )


def analyze(database_url: str, *tables: str) -> None:
    with psycopg.connect(database_url) as connection:
        for table in tables:
            vacuum_analyze(connection, table)


def publish_timings(engine: Engine, database_url: str, receiver_url: str, publishes: int) -> tuple[list[float], list[float]]:
    subscribe(engine, 1000, receiver_url, "invoice.paid")
    analyze(database_url, "outboxkit_subscriptions")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE bench_invoices (id bigserial PRIMARY KEY, amount integer NOT NULL)"))
    inside, commits = [], []
    for number in range(publishes):
        with Session(engine) as session:
            session.execute(text("INSERT INTO bench_invoices (amount) VALUES (:amount)"), {"amount": number})
            started = time.perf_counter()
            published = publish(session, "invoice.paid", {"invoice": f"in_{number}", "amount": number})
            inside.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            session.commit()
            commits.append((time.perf_counter() - started) * 1000)
        assert published.deliveries == 1000
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE outboxkit_event_deliveries, outboxkit_events, outboxkit_subscriptions"))
    return inside, commits


def drained_rate(kit: OutboxKit, outbox: type, database_url: str, table: str, rows: int) -> float:
    analyze(database_url, table)
    started = time.perf_counter()
    result = kit.drainer(outbox).drain()
    elapsed = time.perf_counter() - started
    with psycopg.connect(database_url) as connection:
        done = connection.execute(f"SELECT count(*) FROM {table} WHERE status = 'done'").fetchone()
        connection.execute(f"TRUNCATE {table}")
        connection.commit()
    if done is None or done[0] != rows:
        raise RuntimeError(f"{table}: {done} of {rows} rows done after the drain ({result})")
    return rows / elapsed


def fanout_rounds(
    engine: Engine, kit: OutboxKit, database_url: str, receiver_url: str, *, events: int, subscribers: int, rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Per round: the plain drain, the fan-out drain (a destination per subscription), and the fan-out drain with
    every subscription on its host's one destination (the A/B of that choice, in the same run)."""
    subscribe(engine, subscribers, receiver_url, "order.shipped")
    rows = events * subscribers
    plain: list[float] = []
    fanout: list[float] = []
    host_fanout: list[float] = []
    for round_number in range(rounds):
        with psycopg.connect(database_url) as connection:
            insert_pending_rows(connection, WebhookOutbox.__tablename__, count=rows, target_url=f"{receiver_url}/plain")
        plain.append(drained_rate(kit, WebhookOutbox, database_url, WebhookOutbox.__tablename__, rows))
        for per_subscription, rates in ((True, fanout), (False, host_fanout)):
            set_destinations(engine, receiver_url, per_subscription=per_subscription)
            with Session(engine) as session:
                for number in range(events):
                    publish(session, "order.shipped", {"order": number})
                session.commit()
            rates.append(drained_rate(kit, EventDelivery, database_url, "outboxkit_event_deliveries", rows))
        print(f"round {round_number + 1}: plain {plain[-1]:.0f} rows/s, fan-out {fanout[-1]:.0f} rows/s "
              f"({fanout[-1] / plain[-1]:.2f}), host destination {host_fanout[-1]:.0f} rows/s "
              f"({host_fanout[-1] / plain[-1]:.2f}); load {os.getloadavg()[0]:.1f}", flush=True)
    return plain, fanout, host_fanout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishes", type=int, default=200, help="publishes to 1,000 subscriptions (step 1)")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args(argv)
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "receiver.py")], stdout=subprocess.PIPE, text=True, env=SUBPROCESS_ENV
    )
    engine = create_engine(scratch.sqlalchemy_url, pool_size=10, max_overflow=20)
    try:
        assert receiver.stdout is not None
        receiver_url = f"http://127.0.0.1:{int(receiver.stdout.readline().split()[1])}"
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)
        inside, commits = publish_timings(engine, scratch.database_url, receiver_url, arguments.publishes)
        print(f"publish to 1,000 subscriptions: p50 {percentile(inside, 0.5):.1f} ms, p95 {percentile(inside, 0.95):.1f} ms "
              f"inside the transaction; commit p95 {percentile(commits, 0.95):.1f} ms", flush=True)
        with OutboxKit(engine, [WebhookOutbox, EventDelivery], settings=SETTINGS) as kit:
            plain, fanout, host_fanout = fanout_rounds(
                engine, kit, scratch.database_url, receiver_url,
                events=arguments.events, subscribers=arguments.subscribers, rounds=arguments.rounds,
            )
    finally:
        engine.dispose()
        receiver.terminate()
        receiver.wait(timeout=10)
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
    ratios = [fan / base for fan, base in zip(fanout, plain, strict=True)]
    host_ratios = [fan / base for fan, base in zip(host_fanout, plain, strict=True)]
    figures = {
        "publish_ms_1000_subscribers": round(percentile(inside, 0.95), 2),
        "publish_ms_1000_subscribers_p50": round(percentile(inside, 0.5), 2),
        "publish_commit_ms_p95": round(percentile(commits, 0.95), 2),
        "fanout_delivery_rows_per_s": round(statistics.median(fanout)),
        "plain_drain_rows_per_s": round(statistics.median(plain)),
        "fanout_ratio": round(statistics.median(ratios), 3),
        "fanout_ratio_host_destination": round(statistics.median(host_ratios), 3),
        "delivery_rows_per_round": arguments.events * arguments.subscribers,
        "rounds": arguments.rounds,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
