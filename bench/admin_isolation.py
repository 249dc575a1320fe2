"""Benchmark: the host application's writes while the admin serves 24 heavy filters at once.

Builds a scratch database (dropped afterwards) with the example service's
tables and ``--done`` delivered rows in ``webhook_outbox`` (300,000 by
default; ``--done 30000`` for a quick run), ``VACUUM ANALYZE``.  Then it
starts the example service (``exampleapp.app.create_app``: ``POST /grants``
writes a grant and its outbox row in one transaction through the kit's
engine, and the admin is mounted at ``/admin``) under uvicorn in a child
process on 127.0.0.1, with its drain loops and scheduler off so only the two
kinds of request load the server.

1. **Alone**: ``--writes`` sequential ``POST /grants``, timed.
2. **During admin load**: ``--admin-clients`` threads (24) each send the
   heavy admin filter again and again (``--admin-path``: the done rows whose
   payload contains a 2-character string no row holds, so each one reads the
   whole table); once every client is about to send its first request, the
   same ``POST /grants`` run is timed again.  Every admin request's duration
   and status are recorded (200, 503 "narrow the filter" at the admin's time
   limit, 503 "busy" when the admin's own pool had no connection in time).

The two phases alternate ``--rounds`` times (3), so load from elsewhere on a
shared host falls on both alike; each figure is the median over the rounds
of that round's percentile.  Figures: ``host_write_p95_ms_alone``,
``host_write_p95_ms_during_admin_load``, their ratio (target <= 1.5) and
``admin_request_max_s`` over every round (target <= the admin's time limit + 1 s).  ``--statement-timeout``, ``--admin-pool-size``
and ``--admin-pool-timeout`` set the admin's settings for the run.

    .venv/bin/python bench/admin_isolation.py [--done 300000] [--writes 300] [--admin-clients 24]

Server: ``OUTBOXKIT_BENCH_DATABASE_URL`` (a libpq URL of any database on a
server where the user may create databases), else 127.0.0.1:5432/test.  The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import httpx  # noqa: E402
import psycopg  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from bench.admin_overview import example_database  # noqa: E402
from outboxkit import OutboxKitSettings  # noqa: E402

PASSWORD = "bench"
HEAVY_FILTER = "/admin/api/outboxes/webhooks/rows?status=done&payload_column=payload&payload_contains=zq"
FILL = """
INSERT INTO webhook_outbox (event, target_url, payload, status, attempts, last_status_code,
                            next_attempt_at, created_at, updated_at, delivered_at)
SELECT 'grant.created', 'http://127.0.0.1:9/hook', jsonb_build_object('n', g, 'note', repeat('x', 40)), 'done', 1, 200,
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, %(done)s) AS g
"""


def application() -> FastAPI:
    """The example service as the child process serves it (``uvicorn --factory``), from the bench's variables."""
    from exampleapp.app import create_app

    settings = OutboxKitSettings(
        drain_enabled=False,
        listen_enabled=False,
        scheduler_enabled=False,
        admin_statement_timeout_seconds=float(os.environ["OUTBOXKIT_BENCH_STATEMENT_TIMEOUT"]),
        admin_pool_size=int(os.environ["OUTBOXKIT_BENCH_ADMIN_POOL_SIZE"]),
        admin_pool_timeout_seconds=float(os.environ["OUTBOXKIT_BENCH_ADMIN_POOL_TIMEOUT"]),
    )
    return create_app(os.environ["OUTBOXKIT_BENCH_APP_DATABASE_URL"], settings=settings, admin_password=PASSWORD)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(url: str, port: int, arguments: argparse.Namespace) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "OUTBOXKIT_BENCH_APP_DATABASE_URL": url,
        "OUTBOXKIT_BENCH_STATEMENT_TIMEOUT": str(arguments.statement_timeout),
        "OUTBOXKIT_BENCH_ADMIN_POOL_SIZE": str(arguments.admin_pool_size),
        "OUTBOXKIT_BENCH_ADMIN_POOL_TIMEOUT": str(arguments.admin_pool_timeout),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "admin")]),
    }
    command = [sys.executable, "-m", "uvicorn", "--factory", "bench.admin_isolation:application",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=environment, cwd=ROOT)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
            return process
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("the example service did not start") from None
            time.sleep(0.1)


def time_writes(client: httpx.Client, count: int) -> list[float]:
    samples = []
    for index in range(count):
        started = time.perf_counter()
        response = client.post("/grants", json={"workspace": f"bench-{index}", "amount": 1})
        samples.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return samples


class AdminLoad:
    """``clients`` threads sending the heavy filter until stopped; every request's duration and outcome."""

    def __init__(self, base_url: str, clients: int, path: str) -> None:
        self.base_url, self.path = base_url, path
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.durations: list[float] = []
        self.outcomes: Counter[str] = Counter()
        self.started = threading.Barrier(clients + 1)
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> AdminLoad:
        for thread in self.threads:
            thread.start()
        self.started.wait(timeout=120)  # every client is about to send its first request
        return self

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, auth=("admin", PASSWORD), timeout=300) as client:
            self.started.wait(timeout=120)
            while not self.stop.is_set():
                started = time.perf_counter()
                response = client.get(self.path)
                elapsed = time.perf_counter() - started
                detail = response.json().get("detail", "") if response.status_code != 200 else ""
                outcome = str(response.status_code)
                if "Narrow the filter" in detail:
                    outcome += " narrow the filter"
                elif "busy" in detail:
                    outcome += " busy"
                with self.lock:
                    self.durations.append(elapsed)
                    self.outcomes[outcome] += 1

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--done", type=int, default=300_000, help="delivered rows in the outbox (30000 for a quick run)")
    parser.add_argument("--writes", type=int, default=300, help="POST /grants timed in each phase")
    parser.add_argument("--admin-clients", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3, help="alone / during-load phase pairs, alternating")
    parser.add_argument("--admin-path", default=HEAVY_FILTER)
    defaults = OutboxKitSettings()
    parser.add_argument("--statement-timeout", type=float, default=defaults.admin_statement_timeout_seconds)
    parser.add_argument("--admin-pool-size", type=int, default=defaults.admin_pool_size)
    parser.add_argument("--admin-pool-timeout", type=float, default=defaults.admin_pool_timeout_seconds)
    arguments = parser.parse_args()

    process = None
    with example_database("isolation") as url:
        try:
            started = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute(FILL, {"done": arguments.done})
                connection.execute("VACUUM ANALYZE")
            print(f"filled {arguments.done:,} done rows in {time.perf_counter() - started:.1f}s")

            port = free_port()
            process = serve(url, port, arguments)
            base_url = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base_url, timeout=120) as client:
                time_writes(client, 20)  # warm the pool and the statement caches
                alone, during, loads = [], [], []
                for _ in range(arguments.rounds):
                    alone.append(time_writes(client, arguments.writes))
                    with AdminLoad(base_url, arguments.admin_clients, arguments.admin_path) as load:
                        during.append(time_writes(client, arguments.writes))
                    loads.append(load)
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=60)

    def median_of(rounds: list[list[float]], fraction: float) -> float:
        return statistics.median(percentile(samples, fraction) for samples in rounds)

    alone_p95, during_p95 = median_of(alone, 0.95), median_of(during, 0.95)
    durations = [duration for load in loads for duration in load.durations]
    outcomes = sum((load.outcomes for load in loads), Counter())
    result = {
        "host_write_p50_ms_alone": round(median_of(alone, 0.5), 2),
        "host_write_p95_ms_alone": round(alone_p95, 2),
        "host_write_p50_ms_during_admin_load": round(median_of(during, 0.5), 2),
        "host_write_p95_ms_during_admin_load": round(during_p95, 2),
        "host_write_p95_ratio": round(during_p95 / alone_p95, 2),
        "host_write_p95_ms_by_round": [
            [round(percentile(quiet, 0.95), 1), round(percentile(loaded, 0.95), 1)]
            for quiet, loaded in zip(alone, during, strict=True)
        ],
        "admin_request_max_s": round(max(durations), 2),
        "admin_request_p50_s": round(statistics.median(durations), 2),
        "admin_requests": dict(sorted(outcomes.items())),
        "admin_clients": arguments.admin_clients,
        "statement_timeout_s": arguments.statement_timeout,
        "admin_pool_size": arguments.admin_pool_size,
        "admin_pool_timeout_s": arguments.admin_pool_timeout,
        "done_rows": arguments.done,
        "writes": arguments.writes,
        "rounds": arguments.rounds,
        "load_average": round(os.getloadavg()[0], 1),
    }
    ratio_met = result["host_write_p95_ratio"] <= 1.5
    admin_met = result["admin_request_max_s"] <= arguments.statement_timeout + 1
    print(f"target ratio <= 1.5: {'met' if ratio_met else 'NOT met'}; "
          f"target admin_request_max_s <= {arguments.statement_timeout + 1:g}: {'met' if admin_met else 'NOT met'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
