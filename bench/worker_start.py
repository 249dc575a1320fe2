"""Worker start-up: how long ``outboxkit worker`` takes from process spawn to draining, and what it imports.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, with the example ``WebhookOutbox``:

1. ``--starts`` times (default 5): spawn ``python -m outboxkit.cli --app
   bench.worker_app:kit_from_environment worker`` (a kit over the example
   outbox, no web framework), time it to its ``worker.started`` log line
   (``draining ... in this process``: loops started, LISTEN open), read its
   RSS there, then stop it with SIGTERM;
2. one more start under ``python -X importtime``: the total import time and
   the largest top-level packages (cumulative), and whether the worker
   imported the CLI's table and colour libraries (rich, pygments) or httpx's
   own command line (click), none of which the drain uses.

Run from the repository root::

    .venv/bin/python bench/worker_start.py

The last line printed is one JSON object: ``worker_start_s`` (median),
``worker_rss_mb_at_ready`` (median), ``import_s`` and the heavy modules found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psutil  # noqa: E402
import psycopg  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402

SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'admin'}"}
COMMAND = [sys.executable, "-m", "outboxkit.cli", "--app", "bench.worker_app:kit_from_environment", "worker"]
READY = "draining webhooks in this process"
# Imported by the CLI's tables (rich), by rich (pygments) or by httpx's own command line (click): none is needed to drain.
NOT_NEEDED_TO_DRAIN = ("rich", "pygments", "click", "markdown_it")


def one_start(sqlalchemy_url: str, *, import_time: bool = False) -> tuple[float, float, list[str]]:
    """Seconds from spawn to the ready line, RSS in MB there, and (with ``import_time``) its ``-X importtime`` lines."""
    environment = {**SUBPROCESS_ENV, "BENCH_WORKER_DATABASE_URL": sqlalchemy_url}
    command = [COMMAND[0], "-X", "importtime", *COMMAND[1:]] if import_time else COMMAND
    started = time.perf_counter()
    worker = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment)
    lines: list[str] = []
    try:
        assert worker.stderr is not None
        for line in worker.stderr:
            if READY in line:
                break
            lines.append(line)
        else:
            raise RuntimeError("the worker exited before it was ready:\n" + "".join(lines[-20:]))
        elapsed = time.perf_counter() - started
        rss_mb = psutil.Process(worker.pid).memory_info().rss / 2**20
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return elapsed, rss_mb, lines


def imports(lines: list[str]) -> tuple[float, list[tuple[str, float]], list[str]]:
    """From ``-X importtime`` lines: total seconds, the ten largest top-level packages, the heavy ones imported."""
    packages: dict[str, float] = {}
    for line in lines:
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(2)) == 1:  # top level: its cumulative time includes its children
            package = match.group(3).split(".")[0]
            packages[package] = packages.get(package, 0.0) + int(match.group(1)) / 1e6
    largest = sorted(packages.items(), key=lambda item: -item[1])[:10]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines if line.startswith("import time:")}
    return sum(packages.values()), largest, sorted(name for name in NOT_NEEDED_TO_DRAIN if name in imported)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="worker start-up benchmark (see the module docstring)")
    parser.add_argument("--starts", type=int, default=5, help="worker starts to time (default 5)")
    arguments = parser.parse_args(argv)
    if arguments.starts < 1:
        parser.error("--starts must be >= 1")

    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    try:
        from exampleapp.models import Base
        from sqlalchemy import create_engine

        engine = create_engine(scratch.sqlalchemy_url)
        Base.metadata.create_all(engine)
        engine.dispose()
        print(f"database {scratch.name}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
        import_s, largest, heavy_imported = imports(one_start(scratch.sqlalchemy_url, import_time=True)[2])
        print(f"imports of the worker command: {import_s:.3f} s; largest: "
              + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in largest))
        print(f"imported but not needed to drain: {', '.join(heavy_imported) or 'none'}")
        starts = []
        for number in range(arguments.starts):
            elapsed, rss_mb, _ = one_start(scratch.sqlalchemy_url)
            starts.append((elapsed, rss_mb))
            print(f"  start {number + 1}: ready in {elapsed:.3f} s, RSS {rss_mb:.1f} MB")
        start_s = statistics.median(elapsed for elapsed, _ in starts)
        rss_mb = statistics.median(rss for _, rss in starts)
        print(f"worker start-up: median {start_s:.3f} s (target <= 1 on a quiet host), RSS at ready {rss_mb:.1f} MB")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        print(json.dumps({
            "worker_start_s": round(start_s, 3),
            "worker_rss_mb_at_ready": round(rss_mb, 1),
            "import_s": round(import_s, 3),
            "imported_not_needed_to_drain": heavy_imported,
        }))
        return 0
    finally:
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
