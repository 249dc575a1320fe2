"""Benchmark: an application's requests while a backlog drains in the same process.

The application builds its engine the way the README shows (``create_engine(url)``: SQLAlchemy's default
pool, 5 plus 10 overflow) and serves ``--app-threads`` request threads (16: enough to fill that pool by
themselves).  Each request is one transaction on the application's engine (an insert into a table of its
own, then ``--request-hold-ms`` of work in the transaction: 20 ms of ``pg_sleep``), timed from the moment it
asks for a connection, then a 5 ms pause.  In the same process the kit's
drain loops deliver the outbox to a local receiver (``bench/receiver.py``).

Each round has two phases of ``--phase-seconds`` (5 s), run back to back:

1. **idle**: the requests alone, no row in the outbox;
2. **backlog**: ``--backlog`` rows (10,000 by default; ``--backlog 100000`` for the figure in
   docs/performance.md) are inserted, the drain loops start, and the same requests run while they drain.

``app_request_p95_ratio_during_backlog_drain`` is the backlog phase's p95 over the idle phase's, the median
over ``--rounds`` rounds (target <= 1.5).  Every round runs once with the code in this checkout and once with
``--baseline`` (a directory holding another version's ``outboxkit`` package, e.g. an extract of ``main``:
``git archive main | tar -x -C /tmp/main``), alternating, each in a child process of its own on its own
scratch database, so load from elsewhere on a shared host falls on both alike.

    .venv/bin/python bench/drain_pool.py --baseline /tmp/main [--backlog 100000]

Server: ``OUTBOXKIT_BENCH_DATABASE_URL`` (a libpq URL of any database on a server where the user may create
databases), else 127.0.0.1:5432/test.  The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CREATE_APP_TABLE = "CREATE TABLE IF NOT EXISTS app_requests (id bigserial PRIMARY KEY, note text, at timestamptz DEFAULT now())"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def phases(result: dict[str, object]) -> tuple[list[float], list[float]]:
    """A round's request latencies (ms): idle, then during the drain."""
    idle, during = result["idle"], result["during"]
    assert isinstance(idle, list) and isinstance(during, list)
    return idle, during


def child(arguments: argparse.Namespace) -> None:
    """One round with the ``outboxkit`` found first on ``sys.path``: prints its two phases' latencies as JSON."""
    from exampleapp.models import WebhookOutbox
    from sqlalchemy import create_engine, insert, text

    from bench.admin_overview import example_database
    from outboxkit import OutboxKit, OutboxKitSettings

    with example_database("drainpool") as url:
        sqlalchemy_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        engine = create_engine(sqlalchemy_url)  # the README's engine: SQLAlchemy's default pool
        with engine.begin() as connection:
            connection.execute(text(CREATE_APP_TABLE))
        settings = OutboxKitSettings(drain_interval_seconds=3600, scheduler_enabled=False, schedules_enabled=False)
        kit = OutboxKit(engine, [WebhookOutbox], settings=settings)

        def requests_for(seconds: float) -> list[float]:
            samples: list[float] = []
            lock = threading.Lock()
            stop_at = time.monotonic() + seconds

            def serve() -> None:
                mine = []
                while time.monotonic() < stop_at:
                    started = time.perf_counter()
                    with engine.begin() as connection:
                        connection.execute(text("INSERT INTO app_requests (note) VALUES ('request')"))
                        connection.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": arguments.request_hold_ms / 1000})
                    mine.append((time.perf_counter() - started) * 1000)
                    time.sleep(0.005)  # a request rate, not a busy loop
                with lock:
                    samples.extend(mine)

            threads = [threading.Thread(target=serve) for _ in range(arguments.app_threads)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return samples

        try:
            requests_for(1.0)  # warm the pool
            idle = requests_for(arguments.phase_seconds)
            rows = [{"event": "bench", "target_url": arguments.target, "payload": {"n": n}} for n in range(arguments.backlog)]
            with engine.begin() as connection:
                connection.execute(insert(WebhookOutbox.__table__), rows)  # type: ignore[arg-type]
            started = time.monotonic()
            kit.worker.start()
            during = requests_for(arguments.phase_seconds)
            with engine.connect() as connection:
                delivered = connection.execute(text("SELECT count(*) FROM webhook_outbox WHERE status = 'done'")).scalar_one()
            elapsed = time.monotonic() - started
        finally:
            kit.worker.stop()
            kit.close()
            engine.dispose()
    import outboxkit

    print(json.dumps({"idle": idle, "during": during, "delivered": delivered, "seconds": elapsed, "code": outboxkit.__file__}))


def run_child(code: Path, arguments: argparse.Namespace, target: str) -> dict[str, object]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(code / "admin")])}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--target", target,
               "--backlog", str(arguments.backlog), "--phase-seconds", str(arguments.phase_seconds),
               "--app-threads", str(arguments.app_threads), "--request-hold-ms", str(arguments.request_hold_ms)]
    output = subprocess.run(command, env=environment, cwd=code, capture_output=True, text=True, timeout=1800)
    if output.returncode != 0:
        raise RuntimeError(f"the round with {code} failed:\n{output.stderr[-4000:]}")
    result: dict[str, object] = json.loads(output.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=10_000, help="rows to drain in each backlog phase (100000 for the docs)")
    parser.add_argument("--phase-seconds", type=float, default=5.0)
    parser.add_argument("--app-threads", type=int, default=16)
    parser.add_argument("--request-hold-ms", type=float, default=20.0, help="work each request does in its transaction")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a directory with another version's outboxkit package (A/B)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        child(arguments)
        return

    receiver = subprocess.Popen([sys.executable, str(ROOT / "bench" / "receiver.py"), "--port", "0"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().split()[-1]
        target = f"http://127.0.0.1:{port}/hook"
        codes = {"this": ROOT}
        if arguments.baseline is not None:
            codes["baseline"] = arguments.baseline.resolve()
        rounds: dict[str, list[dict[str, object]]] = {name: [] for name in codes}
        loads = []
        for number in range(arguments.rounds):
            order = list(codes) if number % 2 == 0 else list(reversed(codes))
            for name in order:
                result = run_child(codes[name], arguments, target)
                rounds[name].append(result)
                loads.append(os.getloadavg()[0])
                idle, during = phases(result)
                print(f"round {number + 1} {name}: p95 idle {percentile(idle, 0.95):.1f} ms, during the drain "
                      f"{percentile(during, 0.95):.1f} ms; {result['delivered']} rows delivered in the phase; "
                      f"load {loads[-1]:.1f} ({result['code']})", flush=True)
    finally:
        receiver.terminate()
        receiver.wait(timeout=30)

    summary: dict[str, object] = {"backlog_rows": arguments.backlog, "app_threads": arguments.app_threads,
                                  "request_hold_ms": arguments.request_hold_ms,
                                  "phase_seconds": arguments.phase_seconds, "rounds": arguments.rounds}
    for name, results in rounds.items():
        suffix = "" if name == "this" else "_baseline"
        idle_p95 = [percentile(phases(result)[0], 0.95) for result in results]
        during_p95 = [percentile(phases(result)[1], 0.95) for result in results]
        ratios = [during / idle for idle, during in zip(idle_p95, during_p95, strict=True)]
        summary[f"app_request_p95_ratio_during_backlog_drain{suffix}"] = round(statistics.median(ratios), 2)
        summary[f"app_request_p95_ms_idle{suffix}"] = round(statistics.median(idle_p95), 1)
        summary[f"app_request_p95_ms_during_drain{suffix}"] = round(statistics.median(during_p95), 1)
        summary[f"rows_delivered_in_phase{suffix}"] = statistics.median(int(str(result["delivered"])) for result in results)
    summary["load_average_min"] = round(min(loads), 1)
    summary["load_average_max"] = round(max(loads), 1)
    met = summary["app_request_p95_ratio_during_backlog_drain"] <= 1.5  # type: ignore[operator]
    print(f"target app_request_p95_ratio_during_backlog_drain <= 1.5: {'met' if met else 'NOT met'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
