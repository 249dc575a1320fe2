"""Benchmark: schedule rows fired by several processes, each occurrence once and on time.

Builds a scratch database (dropped afterwards) with the kit's tables and
``--schedules`` rows (10,000 by default) of ``every(seconds=--period)``
whose start instants are spread evenly over one period, all running the job
``record``, which inserts (schedule, fire time, clock_timestamp()) into a
table of its own.  ``--processes`` worker processes (3) each run a
``ScheduleRunner``; the rows are inserted once every worker is firing, and
the workers are stopped (SIGTERM) ``--seconds`` later; then it reads what
happened:

* ``fire_lateness_p50_ms``, ``fire_lateness_p99_ms``: when the job started
  minus its fire time, over the occurrences due in the measured window
  (from the first fire time to ``--seconds`` minus a margin).  Target: p99
  <= 1,000 ms;
* ``duplicates``: job runs beyond one per occurrence (must be 0);
* ``missed``: occurrences in the window recorded ``missed`` or
  ``abandoned`` (must be 0 without kills); ``unfired_at_stop``: occurrences
  in the window that had not run yet when the workers stopped (still due in
  their rows: more than 0 means the workers fell behind);
* ``claim_ms_<rows>``: the claim (``FOR UPDATE SKIP LOCKED``, 100 due rows
  among 10,000 and 100,000 schedule rows, the rest not due), median of 30;
  flat when the due index serves it;
* ``cpu_ms_per_firing``: the workers' CPU time (user + system) per run,
  counted from when each was firing (start-up imports left out).

``--profile FILE`` samples the first worker with py-spy (GIL holder only,
a CPU profile) into FILE as collapsed stacks; ``bench/profile_summary.py
FILE`` reads it.

``--kill-every N`` SIGKILLs a random worker every N seconds and starts a new
one (use a short ``--period`` and ``--lease``); the JSON then adds
``kills``, and ``missed`` includes the occurrences recorded ``missed``
while a killed worker's lease had not expired yet, and its runs
``abandoned``.

    python bench/schedules.py [--schedules 10000] [--period 60] [--seconds 120] [--processes 3]
    python bench/schedules.py --schedules 5 --period 2 --seconds 120 --kill-every 10 --lease 6

Server: ``DATABASE_URL`` (a libpq URL on a server where the user may create
databases), else 127.0.0.1:5432/test.  The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import psycopg  # noqa: E402
from sqlalchemy import Engine, create_engine, text  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from bench.drain_throughput import start_profiler, stop_profiler  # noqa: E402
from outboxkit.schedule_claims import ScheduleClaims  # noqa: E402
from outboxkit.scheduled_jobs import JobContext  # noqa: E402
from outboxkit.tables import kit_metadata  # noqa: E402

FIRINGS_TABLE = """
CREATE TABLE bench_firings (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    scheduled_for timestamptz NOT NULL,
    fired_at timestamptz NOT NULL,
    holder text NOT NULL
)"""
WARMUP_SECONDS = 2.0  # between the rows' insert (the workers are firing by then) and the first fire time
MARGIN_SECONDS = 5.0  # occurrences this close to the end may still be in flight when the workers stop


def record(context: JobContext) -> dict[str, int]:
    context.session.execute(
        text("INSERT INTO bench_firings (name, scheduled_for, fired_at, holder) "
             "VALUES (:name, :scheduled_for, clock_timestamp(), :holder)"),
        {"name": context.job_id, "scheduled_for": context.scheduled_for, "holder": context.leader},
    )
    context.session.commit()
    return {}


# -- a worker process ------------------------------------------------------------------


def worker(url: str, lease: float) -> None:
    """Fire schedules until SIGTERM; print the CPU time spent after start-up as JSON."""
    from outboxkit.schedule_runner import ScheduleRunner

    engine = create_engine(url, pool_size=20, max_overflow=4)
    runner = ScheduleRunner(engine, jobs={"record": record}, lease_seconds=lease, max_idle_seconds=5)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    runner.start()
    ready = cpu_seconds()
    print("ready", flush=True)
    stopping.wait()
    runner.stop(wait=True)
    print(json.dumps({"cpu_ms": (cpu_seconds() - ready) * 1000}), flush=True)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the driver ------------------------------------------------------------------------------


def insert_schedules(engine: Engine, count: int, period: float, first: datetime, *, due: bool = True) -> None:
    """``count`` rows of every(period) starting at ``first + i * period / count`` (or far in the future)."""
    statement = text(
        """
        INSERT INTO outboxkit_schedules (name, trigger_kind, trigger_fields, timezone, target_kind, job,
                                         next_run_at, created_by, changed_by)
        SELECT 'bench-' || (:offset + g), 'every',
               jsonb_build_object('seconds', CAST(:period AS float8),
                                  'start', to_char(start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')),
               'UTC', 'job', 'record', start, 'bench', 'bench'
        FROM generate_series(0, :count - 1) AS g,
             LATERAL (SELECT CAST(:first AS timestamptz) + make_interval(secs => g * CAST(:period AS float8) / :count)
                      + CASE WHEN :due THEN interval '0' ELSE interval '10 years' END AS start) AS s
        """
    )
    with engine.begin() as connection:
        offset = connection.execute(text("SELECT count(*) FROM outboxkit_schedules")).scalar_one()
        connection.execute(statement, {"offset": offset, "count": count, "period": period, "first": first, "due": due})
        connection.execute(text("ANALYZE outboxkit_schedules"))


def claim_ms(engine: Engine, repeats: int = 30) -> float:
    """Median time of one claim of 100 due rows (rolled back, so every repeat finds the same rows)."""
    claims = ScheduleClaims(jobs=["record"], outboxes={}, holder="bench", lease_seconds=60)
    now = datetime.now(timezone.utc)
    with engine.begin() as connection:
        connection.execute(text("UPDATE outboxkit_schedules SET next_run_at = now() + interval '10 years'"))
        connection.execute(text("UPDATE outboxkit_schedules SET next_run_at = now() - interval '1 second' "
                                "WHERE id IN (SELECT id FROM outboxkit_schedules ORDER BY random() LIMIT 100)"))
        connection.execute(text("ANALYZE outboxkit_schedules"))
    timings = []
    for _ in range(repeats):
        with engine.connect() as connection:
            transaction = connection.begin()
            started = time.perf_counter()
            rows = claims.due(connection, now=now, skip=(), limit=100)
            timings.append((time.perf_counter() - started) * 1000)
            transaction.rollback()
        assert len(rows) == 100, len(rows)
    return round(statistics.median(timings), 3)


def start_worker(url: str, lease: float) -> subprocess.Popen[str]:
    """A worker process, once it is firing (it may take seconds to start on a busy host)."""
    command = [sys.executable, __file__, "--worker", url, "--lease", str(lease)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def run(args: argparse.Namespace) -> dict[str, object]:
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=2, max_overflow=0)
    workers: list[subprocess.Popen[str]] = []
    try:
        kit_metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(text(FIRINGS_TABLE))
        workers = [start_worker(scratch.sqlalchemy_url, args.lease) for _ in range(args.processes)]
        profiler = start_profiler(workers[0].pid, args.profile) if args.profile else None
        first = datetime.now(timezone.utc) + timedelta(seconds=WARMUP_SECONDS)
        insert_schedules(engine, args.schedules, args.period, first)
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_notify('outboxkit_schedules', '')"))
        started = time.monotonic()
        kills = 0
        while time.monotonic() - started < WARMUP_SECONDS + args.seconds:
            time.sleep(args.kill_every or 1.0)
            if args.kill_every and time.monotonic() - started < WARMUP_SECONDS + args.seconds - args.kill_every:
                victim = random.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                workers[victim] = start_worker(scratch.sqlalchemy_url, args.lease)
                kills += 1
        if profiler is not None:
            stop_profiler(profiler)
        cpu_ms = 0.0
        for process in workers:
            process.send_signal(signal.SIGTERM)
        for process in workers:
            output, _ = process.communicate(timeout=300)
            cpu_ms += json.loads(output.strip().splitlines()[-1])["cpu_ms"]
        window_end = first + timedelta(seconds=args.seconds - MARGIN_SECONDS)
        with engine.connect() as connection:
            lateness = connection.execute(
                text("SELECT CAST(EXTRACT(EPOCH FROM fired_at - scheduled_for) * 1000 AS float8) FROM bench_firings "
                     "WHERE scheduled_for < :end"), {"end": window_end}
            ).scalars().all()
            total, distinct = connection.execute(
                text("SELECT count(*), count(DISTINCT (name, scheduled_for)) FROM bench_firings")
            ).one()
            in_window = connection.execute(
                text("SELECT count(DISTINCT (name, scheduled_for)) FROM bench_firings WHERE scheduled_for < :end"),
                {"end": window_end},
            ).scalar_one()
            recorded_missed = connection.execute(
                text("SELECT count(*) FROM outboxkit_job_runs WHERE outcome IN ('missed', 'abandoned') "
                     "AND scheduled_for < :end"), {"end": window_end}
            ).scalar_one()
        # Fire times of schedule i: first + i * period / n + k * period, before the window's end.
        window = (window_end - first).total_seconds()
        offsets = (index * args.period / args.schedules for index in range(args.schedules))
        expected = sum(math.ceil((window - offset) / args.period) for offset in offsets if window > offset)
        quantiles = statistics.quantiles(lateness, n=100) if len(lateness) >= 2 else [0.0] * 99
        result: dict[str, object] = {
            "schedules": args.schedules,
            "period_seconds": args.period,
            "processes": args.processes,
            "seconds": args.seconds,
            "firings": total,
            "expected_in_window": expected,
            "fire_lateness_p50_ms": round(quantiles[49], 1),
            "fire_lateness_p99_ms": round(quantiles[98], 1),
            "duplicates": total - distinct,
            "missed": recorded_missed,
            "unfired_at_stop": expected - in_window,
        }
        if args.kill_every:
            result["kills"] = kills
        else:
            result["cpu_ms_per_firing"] = round(cpu_ms / max(total, 1), 3)
            result[f"claim_ms_{args.schedules}"] = claim_ms(engine)
            insert_schedules(engine, 100_000 - args.schedules, args.period, first, due=False)
            result["claim_ms_100000"] = claim_ms(engine)
        return result
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=0.0)
    parser.add_argument("--profile", metavar="FILE", help="py-spy the first worker into FILE (collapsed stacks)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.lease)
        return
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
