"""Wake-up latency and failover timings of the elected scheduler, against a real PostgreSQL.

1. Latency: the leader is idle (interval drain at its default 60 s, so only
   the NOTIFY wake-up can deliver quickly).  200 single rows are enqueued,
   each in its own transaction, 50 ms apart.  For each row: the time from the
   application's commit returning to a local HTTP receiver seeing the
   request.  Target: p50 <= 3 ms, p95 <= 5 ms.
2. Failover: a leader and a standby (two kits, two elections).  The leader's
   lock connection is killed with pg_terminate_backend; measured are the time
   to the old leader's demotion (its scheduler stopped) and to the new
   leader's first job run (a job due every second, so it marks the new
   leader's scheduler start).  The kill comes right after the standby's
   probe, so this is the worst case: with the defaults (15 s tick, 60 s
   probe) about 15 s and 60 + 15 s.

Run (creates and drops its own database on the server)::

    .venv/bin/python bench/latency.py                      # real defaults: about 2 minutes
    .venv/bin/python bench/latency.py --tick 1 --probe 2   # quick

The last line is one JSON object: latency_p50_ms, latency_p95_ms,
latency_max_ms, demote_s, failover_first_job_s (plus the intervals used).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine, func, select  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from outboxkit import OutboxKit, OutboxKitSettings, every  # noqa: E402
from outboxkit.election import ElectionState  # noqa: E402
from outboxkit.notify import install_trigger_sql  # noqa: E402
from outboxkit.tables import job_runs, kit_metadata  # noqa: E402

DEFAULT_SERVER = "postgresql://root@127.0.0.1:5432/test"


class LatencyReceiver:
    """A local HTTP receiver that notes when each Idempotency-Key first arrives (perf_counter)."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                seen = time.perf_counter()
                key = self.headers.get("Idempotency-Key", "")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.arrived:
                    receiver.arrivals.setdefault(key, seen)
                    receiver.arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.arrivals) >= count, timeout):
                raise SystemExit(f"only {len(self.arrivals)} of {count} requests arrived within {timeout}s")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def create_database(server: str) -> str:
    name = f"outboxkit_bench_latency_{os.getpid()}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    with engine.begin() as connection:
        Base.metadata.create_all(connection)
        kit_metadata.create_all(connection)
        for statement in install_trigger_sql(WebhookOutbox):
            connection.exec_driver_sql(statement)
    engine.dispose()
    return url


def drop_database(server: str, url: str) -> None:
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure_latency(engine, receiver: LatencyReceiver, *, rows: int, spacing: float) -> list[float]:
    commits: dict[str, float] = {}
    for n in range(rows):
        key = uuid.uuid4()
        with Session(engine) as session:
            session.add(WebhookOutbox(idempotency_key=key, event="bench", target_url=receiver.url, payload={"n": n}))
            session.commit()
        commits[str(key)] = time.perf_counter()
        time.sleep(spacing)
    receiver.wait_for(rows, timeout=60)
    return [(receiver.arrivals[key] - committed) * 1000 for key, committed in commits.items()]


def measure_failover(engine, url: str, leader: OutboxKit, standby: OutboxKit) -> tuple[float, float]:
    old = leader.scheduler.election
    new = standby.scheduler.elect()
    if not new.wait_for(ElectionState.STANDBY, campaigns=1, timeout=30):
        raise SystemExit("the standby never campaigned")
    killed_at = time.time()
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_terminate_backend(%s)", [old.backend_pid])
    if not old.wait_for(ElectionState.STANDBY, timeout=600):
        raise SystemExit("the old leader never demoted")
    demote_s = time.monotonic() - started
    demoted_at = time.time()  # the old leader's scheduler has stopped: every later run is the new leader's
    if not new.wait_for(ElectionState.LEADER, timeout=600):
        raise SystemExit("the standby never took over")
    while True:  # the new leader's first run
        with engine.connect() as connection:
            first = connection.execute(
                select(func.min(job_runs.c.started_at)).where(job_runs.c.started_at > func.to_timestamp(demoted_at))
            ).scalar()
        if first is not None:
            return demote_s, first.timestamp() - killed_at
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=os.environ.get("OUTBOXKIT_BENCH_DATABASE_URL", DEFAULT_SERVER))
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--spacing", type=float, default=0.05, help="seconds between enqueues")
    parser.add_argument("--tick", type=float, default=15.0, help="leader tick seconds (default: the real 15)")
    parser.add_argument("--probe", type=float, default=60.0, help="standby probe seconds (default: the real 60)")
    parser.add_argument(
        "--drain-async-commit",
        action="store_true",
        help="run the kit's transactions with synchronous_commit=off, to see what the WAL flush of the claim costs",
    )
    options = parser.parse_args()

    url = create_database(options.server)
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), pool_size=5)
    kit_engine = engine
    if options.drain_async_commit:
        kit_engine = create_engine(
            engine.url, pool_size=5, connect_args={"options": "-c synchronous_commit=off"}
        )
    settings = OutboxKitSettings(leader_tick_seconds=options.tick, standby_probe_seconds=options.probe)
    receiver = LatencyReceiver()
    leader = OutboxKit(kit_engine, [WebhookOutbox], settings=settings)
    standby = OutboxKit(kit_engine, [WebhookOutbox], settings=settings)
    for kit in (leader, standby):
        # A job due every second, so the first run after a promotion shows when the new leader's
        # scheduler started (the kit's own drain jobs fire on a 60 s grid, which would add up to 60 s).
        kit.scheduler.add_job("bench.heartbeat", lambda context: None, every(seconds=1))
    try:
        leader.worker.start()  # the drain loop and its listener, as kit.lifespan starts them in every process
        election = leader.scheduler.elect()
        print(f"waiting one leader tick ({options.tick:g}s) for the leader to start...", flush=True)
        if not election.wait_for(ElectionState.LEADER, timeout=options.tick + 30):
            raise SystemExit("no leader")
        leader.worker.listener.wait_for_generation(1, timeout=30)
        latencies = measure_latency(engine, receiver, rows=options.rows, spacing=options.spacing)
        p50, p95, most = percentile(latencies, 0.5), percentile(latencies, 0.95), max(latencies)
        print(f"commit -> receiver over {len(latencies)} rows: p50 {p50:.2f} ms, p95 {p95:.2f} ms, max {most:.2f} ms")
        print(f"failover with tick {options.tick:g}s, probe {options.probe:g}s ...", flush=True)
        demote_s, first_job_s = measure_failover(engine, url, leader, standby)
        print(f"pg_terminate_backend -> old leader demoted: {demote_s:.2f} s")
        print(f"pg_terminate_backend -> new leader's first job: {first_job_s:.2f} s")
    finally:
        standby.close()
        leader.close()
        receiver.close()
        kit_engine.dispose()
        engine.dispose()
        drop_database(options.server, url)
    print(
        json.dumps(
            {
                "latency_p50_ms": round(p50, 3),
                "latency_p95_ms": round(p95, 3),
                "latency_max_ms": round(most, 3),
                "demote_s": round(demote_s, 3),
                "failover_first_job_s": round(first_job_s, 3),
                "leader_tick_s": options.tick,
                "standby_probe_s": options.probe,
                "rows": len(latencies),
                "drain_async_commit": options.drain_async_commit,
            }
        )
    )


if __name__ == "__main__":
    main()
