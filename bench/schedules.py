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
* ``missed``: occurrences in the window recorded ``missed`` though the claim
  found them no more than their grace late (a real loss: must be 0);
  ``missed_beyond_grace``: recorded ``missed`` because every process that
  could fire them was away longer than the grace (``--grace``, 300 s by
  default as for any schedule; expected only when the processes are down
  that long);
* ``coalesced``: fire times in the window that ran within a run for a later
  fire time (they waited, within the grace, for a slot or a process);
  ``unfired_at_stop``: fire times in the window for which no run had started
  when the workers stopped, neither for them nor for a later fire time
  within the grace (still due in their rows: more than 0 means the workers
  fell behind);
* ``claim_ms_<rows>``: the claim (``FOR UPDATE SKIP LOCKED``, 100 due rows
  among 10,000 and 100,000 schedule rows, the rest not due), median of 30;
  flat when the due index serves it;
* ``cpu_ms_per_firing``: the workers' CPU time (user + system) per run,
  counted from when each was firing (start-up imports left out).

``--cadence`` is the case of one every-1 s job alone, its workers at the
runner's defaults (no short lease, no idle cap): it runs in one process and
then in three, each for ``--seconds`` (65 by default: a window of 60 fire
times), and reports, for each, ``occurrences_run`` (fire times in the window
the job ran for), ``expected`` and ``occurrences_run_per_expected`` (1.0:
every occurrence ran), with the lateness, ``coalesced`` and ``missed`` as
above, under ``one_process`` and ``three_processes``.

``--profile FILE`` samples the first worker with py-spy (GIL holder only,
a CPU profile) into FILE as collapsed stacks; ``bench/profile_summary.py
FILE`` reads it.

``--kill-every N`` hits a random worker every N seconds (use a short
``--period`` and ``--lease``): with ``--faults kill`` (the default) it
SIGKILLs it and starts a new one; with ``--faults mixed`` it does that or,
as often, terminates every session of it (``pg_terminate_backend``), as the
issue's fault run does.  The JSON then adds ``kills`` and ``cut``, and what
the faults did to the window's occurrences:

* ``abandoned``: runs recorded ``abandoned``: a kill landed between the
  claim that started the run and the statement that records its outcome,
  and its lease expired (the bench's schedules are not
  ``rerun_if_abandoned``, so that occurrence is not run again: at most
  once); ``abandoned_job_ran`` of them had run the job (its row is in the
  job's table: the kill came after the job committed);
* ``errors``: runs whose job failed (a cut session under the job's insert).

    python bench/schedules.py [--schedules 10000] [--period 60] [--seconds 120] [--processes 3]
    python bench/schedules.py --schedules 5 --period 2 --seconds 120 --kill-every 10 --lease 6 [--faults mixed]
    python bench/schedules.py --cadence

Server: ``DATABASE_URL`` (a libpq URL on a server where the user may create
databases), else 127.0.0.1:5432/test.  The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
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
from outboxkit.schedules.claims import ScheduleClaims  # noqa: E402
from outboxkit.schedules.jobs import JobContext  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

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


def worker(url: str, lease: float | None) -> None:
    """Fire schedules until SIGTERM; print the CPU time spent after start-up as JSON.

    ``lease`` None: the runner at its defaults (the cadence case); else that lease and a 5 s idle cap."""
    from outboxkit.schedules.runner import ScheduleRunner

    # Sessions named after the pid (the pool's, and the LISTEN one through the holder), so the driver can cut them.
    engine = create_engine(
        url, pool_size=20, max_overflow=4, connect_args={"application_name": f"bench-schedules:{os.getpid()}"}
    )
    holder = f"bench:{os.getpid()}"
    if lease is None:
        runner = ScheduleRunner(engine, jobs={"record": record}, holder=holder)
    else:
        runner = ScheduleRunner(engine, jobs={"record": record}, holder=holder, lease_seconds=lease, max_idle_seconds=5)
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


def insert_schedules(
    engine: Engine, count: int, period: float, first: datetime, *, grace: int, due: bool = True
) -> None:
    """``count`` rows of every(period) starting at ``first + i * period / count`` (or far in the future)."""
    statement = text(
        """
        INSERT INTO outboxkit_schedules (name, trigger_kind, trigger_fields, timezone, target_kind, job,
                                         next_run_at, misfire_grace_seconds, created_by, changed_by)
        SELECT 'bench-' || (:offset + g), 'every',
               jsonb_build_object('seconds', CAST(:period AS float8),
                                  'start', to_char(start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')),
               'UTC', 'job', 'record', start, :grace, 'bench', 'bench'
        FROM generate_series(0, :count - 1) AS g,
             LATERAL (SELECT CAST(:first AS timestamptz) + make_interval(secs => g * CAST(:period AS float8) / :count)
                      + CASE WHEN :due THEN interval '0' ELSE interval '10 years' END AS start) AS s
        """
    )
    with engine.begin() as connection:
        offset = connection.execute(text("SELECT count(*) FROM outboxkit_schedules")).scalar_one()
        values = {"offset": offset, "count": count, "period": period, "first": first, "due": due, "grace": grace}
        connection.execute(statement, values)
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
            rows = claims.due(connection, now=now, skip=(), limit=100, kind="job")
            timings.append((time.perf_counter() - started) * 1000)
            transaction.rollback()
        assert len(rows) == 100, len(rows)
    return round(statistics.median(timings), 3)


def start_worker(url: str, lease: float | None) -> subprocess.Popen[str]:
    """A worker process, once it is firing (it may take seconds to start on a busy host); ``lease`` None: defaults."""
    command = [sys.executable, __file__, "--worker", url] + ([] if lease is None else ["--lease", str(lease)])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def cut_sessions(database_url: str, pid: int) -> int:
    """Terminate every session of the worker ``pid`` (its pool's and its LISTEN one); returns how many."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        return len(connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name IN (%s, %s)", (f"bench-schedules:{pid}", f"outboxkit-schedules:bench:{pid}"),
        ).fetchall())  # fmt: skip


def coverage(engine: Engine, args: argparse.Namespace, first: datetime, end: datetime) -> tuple[int, int]:
    """The fire times in [first, end) that ran only within a later run (coalesced), and those that never ran.

    A fire time is fired when a run started for it (its run history row is anything but ``missed``), or
    coalesced into a run for a later fire time within the grace; else it is unfired.
    """
    fired: dict[str, list[datetime]] = {}
    with engine.connect() as connection:
        for name, scheduled_for in connection.execute(
            text("SELECT job_id, scheduled_for FROM outboxkit_job_runs WHERE outcome <> 'missed' ORDER BY scheduled_for")
        ):
            fired.setdefault(name, []).append(scheduled_for)
    period, grace, tick = timedelta(seconds=args.period), timedelta(seconds=args.grace), timedelta(milliseconds=1)
    coalesced = unfired = 0
    for index in range(args.schedules):
        runs = fired.get(f"bench-{index}", [])
        moment = first + index * period / args.schedules
        while moment < end:
            position = bisect.bisect_left(runs, moment - tick)
            if position == len(runs) or runs[position] > moment + grace + tick:
                unfired += 1
            elif runs[position] > moment + tick:
                coalesced += 1
            moment += period
    return coalesced, unfired


def fault_outcomes(engine: Engine, end: datetime) -> dict[str, int]:
    """The runs in the window that the faults cut short: abandoned (and whether the job had run), failed."""
    with engine.connect() as connection:
        abandoned, abandoned_ran, errors = connection.execute(
            text("SELECT count(*) FILTER (WHERE outcome = 'abandoned'), "
                 "count(*) FILTER (WHERE outcome = 'abandoned' AND EXISTS (SELECT 1 FROM bench_firings AS f "
                 "WHERE f.name = r.job_id AND f.scheduled_for = r.scheduled_for)), "
                 "count(*) FILTER (WHERE outcome = 'error') "
                 "FROM outboxkit_job_runs AS r WHERE scheduled_for < :end"), {"end": end}
        ).one()  # fmt: skip
    return {"abandoned": abandoned, "abandoned_job_ran": abandoned_ran, "errors": errors}


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
        lease = None if args.cadence else args.lease
        workers = [start_worker(scratch.sqlalchemy_url, lease) for _ in range(args.processes)]
        profiler = start_profiler(workers[0].pid, args.profile) if args.profile else None
        first = datetime.now(timezone.utc) + timedelta(seconds=WARMUP_SECONDS)
        insert_schedules(engine, args.schedules, args.period, first, grace=args.grace)
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_notify('outboxkit_schedules', '')"))
        started = time.monotonic()
        kills = cut = 0
        step = args.kill_every or 1.0
        fault_at = started + step  # on a fixed beat: a replaced worker's start-up does not push the next fault back
        while time.monotonic() - started < WARMUP_SECONDS + args.seconds:
            time.sleep(max(0.0, fault_at - time.monotonic()))
            fault_at += step
            if args.kill_every and time.monotonic() - started < WARMUP_SECONDS + args.seconds - args.kill_every:
                victim = random.randrange(len(workers))
                if args.faults == "mixed" and random.random() < 0.5:
                    cut_sessions(scratch.database_url, workers[victim].pid)
                    cut += 1
                    continue
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                workers[victim] = start_worker(scratch.sqlalchemy_url, lease)
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
            run_in_window = connection.execute(
                text("SELECT count(DISTINCT (name, scheduled_for)) FROM bench_firings WHERE scheduled_for < :end"),
                {"end": window_end},
            ).scalar_one()
            # A missed record's started_at is when the claim found it: beyond the grace, or not (a real loss).
            missed, missed_beyond_grace = connection.execute(
                text("SELECT count(*) FILTER (WHERE started_at - scheduled_for <= make_interval(secs => :grace)), "
                     "count(*) FILTER (WHERE started_at - scheduled_for > make_interval(secs => :grace)) "
                     "FROM outboxkit_job_runs WHERE outcome = 'missed' AND scheduled_for < :end"),
                {"end": window_end, "grace": args.grace},
            ).one()  # fmt: skip
        # Fire times of schedule i: first + i * period / n + k * period, before the window's end.
        window = (window_end - first).total_seconds()
        offsets = (index * args.period / args.schedules for index in range(args.schedules))
        expected = sum(math.ceil((window - offset) / args.period) for offset in offsets if window > offset)
        coalesced, unfired = coverage(engine, args, first, window_end)
        quantiles = statistics.quantiles(lateness, n=100) if len(lateness) >= 2 else [0.0] * 99
        result: dict[str, object] = {
            "schedules": args.schedules,
            "period_seconds": args.period,
            "processes": args.processes,
            "seconds": args.seconds,
            "firings": total,
            "expected_in_window": expected,
            "occurrences_run": run_in_window,
            "occurrences_run_per_expected": round(run_in_window / expected, 4) if expected else None,
            "fire_lateness_p50_ms": round(quantiles[49], 1),
            "fire_lateness_p99_ms": round(quantiles[98], 1),
            "duplicates": total - distinct,
            "missed": missed,
            "missed_beyond_grace": missed_beyond_grace,
            "coalesced": coalesced,
            "unfired_at_stop": unfired,
        }
        if args.kill_every:
            result.update(kills=kills, cut=cut, **fault_outcomes(engine, window_end))
        elif not args.cadence:
            result["cpu_ms_per_firing"] = round(cpu_ms / max(total, 1), 3)
            result[f"claim_ms_{args.schedules}"] = claim_ms(engine)
            insert_schedules(engine, 100_000 - args.schedules, args.period, first, grace=args.grace, due=False)
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
    parser.add_argument("--seconds", type=float, default=None, help="120, or 65 with --cadence")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--lease", type=float, default=None, help="60; the worker's: none, the runner's default")
    parser.add_argument("--grace", type=int, default=300, help="each schedule's misfire grace, seconds")
    parser.add_argument("--kill-every", type=float, default=0.0)
    parser.add_argument("--faults", choices=["kill", "mixed"], default="kill",
                        help="with --kill-every: SIGKILL only, or SIGKILL and cut sessions half each")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the first worker into FILE (collapsed stacks)")
    parser.add_argument("--cadence", action="store_true",
                        help="one every-1 s job at the runner's defaults, in one process and then in three")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.lease)
        return
    if args.lease is None:
        args.lease = 60.0
    if args.cadence:
        print(json.dumps(cadence(args)))
        return
    if args.seconds is None:
        args.seconds = 120.0
    print(json.dumps(run(args)))


def cadence(args: argparse.Namespace) -> dict[str, object]:
    """The cadence case: one every-1 s job, workers at the runner's defaults, in one process and in three."""
    args.schedules, args.period, args.kill_every = 1, 1.0, 0.0
    args.seconds = args.seconds if args.seconds is not None else 60 + MARGIN_SECONDS
    result: dict[str, object] = {"case": "cadence", "period_seconds": 1, "seconds": args.seconds}
    for processes, key in ((1, "one_process"), (3, "three_processes")):
        args.processes = processes
        measured = run(args)
        result[key] = {name: measured[name] for name in (
            "occurrences_run", "expected_in_window", "occurrences_run_per_expected", "fire_lateness_p50_ms",
            "fire_lateness_p99_ms", "duplicates", "missed", "coalesced", "unfired_at_stop",
        )}  # fmt: skip
    return result


if __name__ == "__main__":
    main()
