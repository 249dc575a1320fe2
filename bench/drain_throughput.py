"""Drain throughput: how fast one drainer process empties an outbox, and at what cost.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, with the example ``WebhookOutbox``:

1. ceilings on the same receiver and database: raw httpx POSTs/s (one reused
   client; one thread, then the drain's concurrency) and the raw SKIP LOCKED
   claim-and-mark primitive (see ``bench/ceilings.py``);
2. enqueue ``--rows`` rows through the ORM, one row per transaction, as an
   application does;
3. drain them with ``OutboxKit.drain`` in a loop in a separate drainer
   process (``bench/drain_worker.py``) against a receiver process
   (``bench/receiver.py``), timing first claim to last ``done`` and measuring
   the drainer's CPU, the PostgreSQL backends' CPU and the drainer's peak RSS;
4. check that every row is ``done`` and the receiver saw every key;
5. telemetry: drain ``--rows`` bulk-inserted rows again, alternating runs
   without telemetry, with ``OutboxMetrics`` and ``OutboxTracing`` attached
   and every trace sampled, and with 10% of the traces sampled
   (``--telemetry-rounds`` rounds, default 3, each running the three modes
   back to back in a rotating order).  ``telemetry_ratio`` is the median
   over the rounds of a round's traced rate over its own untraced rate,
   which cancels the host's slow load swings that a best-of-each
   comparison picks up; ``drain_rows_per_s_with_telemetry`` and
   ``drain_rows_per_s_telemetry_baseline`` are each mode's median rate (the
   target is a ratio >= 0.9).  ``--telemetry-breakdown`` adds, to the same
   rounds, drains with metrics only and with tracing only (nothing, 10% and
   every trace sampled), each set against its round's untraced run;
6. commit durability: ``--commit-rounds`` rounds (default 2) of drains of
   ``--rows`` bulk-inserted rows with ``OUTBOXKIT_SYNCHRONOUS_COMMIT=true``
   (the default) and ``false``, interleaved; each drain also reports the
   bench database's commits per delivered row (``pg_stat_database``) and the
   server's WAL syncs per row (``pg_stat_wal``), which show what pays for
   the flushes; ``drain_rows_per_s_sync_commit``,
   ``drain_rows_per_s_async_commit`` and ``sync_commit_ratio`` (median of a
   round's synchronous over its asynchronous rate; target >= 0.9); then, in
   the same rounds, the idle latency in each mode (``bench/latency.py``'s
   set-up: 100 rows 50 ms apart to an idle drain loop, commit to receiver),
   ``idle_latency_p50_ms_*`` and ``idle_latency_p95_ms_*`` (target p95 <= 3
   on a quiet host);
7. do it again with ``--slow-rows`` rows against a receiver that answers each
   request after 50 ms.

``--commit-only`` runs step 6 alone (with ``--commit-rounds`` rounds), for
interleaving before-and-after runs of two checkouts on a busy host.

Run from the repository root::

    .venv/bin/python bench/drain_throughput.py --rows 20000 --slow-rows 3000

The last line printed is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.ceilings import (  # noqa: E402
    httpx_posts_per_second,
    insert_pending_rows,
    primitive_rows_per_second,
    scratch_database,
    vacuum_analyze,
)
from bench.cpu import BackendCpu, ServerCpu  # noqa: E402
from bench.latency import idle_latency, percentile  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

DEFAULT_SERVER = "postgresql://root@127.0.0.1:5432/test"
TABLE = WebhookOutbox.__tablename__
IDLE_LATENCY_ROWS = 100  # per commit mode and round (step 6)
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'admin'}"}


@dataclass(frozen=True)
class CommitCounters:
    """What pays for WAL flushes: the bench database's commits, and the cluster's WAL syncs and records.

    ``commits`` is ``pg_stat_database.xact_commit`` of the bench database
    (the drainer's transactions, plus the benchmark's own reads of these
    counters); ``wal_syncs`` and ``wal_records`` come from ``pg_stat_wal``,
    which counts the whole server, so other sessions on a shared host add to them.
    """

    commits: int
    wal_syncs: int
    wal_records: int

    @classmethod
    def read(cls, server: str, database: str) -> CommitCounters:
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute("SELECT pg_stat_clear_snapshot()")
            (commits,) = connection.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database]
            ).fetchone() or (0,)
            wal_syncs, wal_records = connection.execute("SELECT wal_sync, wal_records FROM pg_stat_wal").fetchone() or (0, 0)
        return cls(commits=int(commits), wal_syncs=int(wal_syncs), wal_records=int(wal_records))

    def minus(self, earlier: CommitCounters) -> CommitCounters:
        return CommitCounters(
            commits=self.commits - earlier.commits,
            wal_syncs=self.wal_syncs - earlier.wal_syncs,
            wal_records=self.wal_records - earlier.wal_records,
        )

    def per_row(self, rows: int) -> str:
        return (f"{self.commits / rows:.2f} commits/row, {self.wal_syncs / rows:.2f} WAL syncs/row (server-wide), "
                f"{self.wal_records / rows:.1f} WAL records/row")


class ReceiverProcess:
    """``bench/receiver.py`` in its own process."""

    def __init__(self, delay_ms: float = 0.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "receiver.py"), "--delay-ms", str(delay_ms)],
            stdout=subprocess.PIPE,
            text=True,
            env=SUBPROCESS_ENV,
        )
        assert self.process.stdout is not None  # opened as a pipe above
        line = self.process.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def keys(self) -> list[str]:
        body = httpx.get(f"{self.url}/_keys", timeout=30.0).text
        return body.split("\n") if body else []

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset", timeout=10.0).raise_for_status()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class DrainRun:
    rows: int
    rows_per_s: float
    drainer_cpu_s: float
    backend_cpu_s: float
    server_cpu_s: float
    backends: int
    peak_rss_mb: float
    counters: CommitCounters
    report: dict[str, Any]  # the drainer's JSON report (bench/drain_worker.py)


def start_profiler(pid: int, output: str) -> subprocess.Popen[bytes]:
    """Sample ``pid`` with py-spy into collapsed stacks: non-blocking (the drainer is not paused), GIL holder only."""
    profiler = Path(sys.executable).with_name("py-spy")
    command = [str(profiler), "record", "--pid", str(pid), "--format", "raw", "--output", output, "--nonblocking"]
    command += ["--threads", "--gil", "--rate", "250"]  # --gil: only the thread running Python, a CPU profile
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(profiler: subprocess.Popen[bytes]) -> None:
    profiler.send_signal(signal.SIGINT)
    try:
        profiler.wait(timeout=30)
    except subprocess.TimeoutExpired:
        profiler.kill()
        profiler.wait()


def run_drainer(
    sqlalchemy_url: str,
    server: str,
    database: str,
    *,
    expected: int,
    concurrency: int | None,
    profile: str | None = None,
    telemetry_parts: str | None = None,
    trace_ratio: float = 1.0,
    synchronous_commit: bool = True,
) -> DrainRun:
    """Start a drainer process, let it drain ``expected`` rows, measure it (and profile it if asked)."""
    command = [sys.executable, str(ROOT / "bench" / "drain_worker.py"), "--database-url", sqlalchemy_url]
    command += ["--expected", str(expected)] + (["--concurrency", str(concurrency)] if concurrency else [])
    if telemetry_parts is not None:  # "metrics", "tracing" or both, comma-separated (bench/drain_worker.py)
        command += ["--telemetry", "--telemetry-parts", telemetry_parts, "--trace-ratio", str(trace_ratio)]
    environment = {**SUBPROCESS_ENV, "OUTBOXKIT_SYNCHRONOUS_COMMIT": "true" if synchronous_commit else "false"}
    worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert worker.stdin is not None and worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError("the drainer did not start")
        drainer = psutil.Process(worker.pid)
        profiler = start_profiler(worker.pid, profile) if profile else None
        if profiler is not None:
            time.sleep(1.0)  # py-spy needs a moment to attach
        backends, server_cpu = BackendCpu(server, database), ServerCpu()
        backends.start()
        server_cpu.start()
        counters_before = CommitCounters.read(server, database)
        cpu_before = drainer.cpu_times()
        worker.stdin.write("go\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        cpu_after = drainer.cpu_times()
        server_seconds = server_cpu.stop()
        backend_seconds = backends.stop()
        if profiler is not None:
            stop_profiler(profiler)
        if not line:
            raise RuntimeError("the drainer died before reporting")
        report = json.loads(line)
        worker.stdin.write("exit\n")
        worker.stdin.flush()
        worker.wait(timeout=30)
        # After the drainer's exit: its backends report their counts when they end.
        counters = CommitCounters.read(server, database).minus(counters_before)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    drainer_seconds = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return DrainRun(
        rows=expected,
        rows_per_s=report["counts"]["delivered"] / report["elapsed_s"],
        drainer_cpu_s=drainer_seconds,
        backend_cpu_s=backend_seconds,
        server_cpu_s=server_seconds,
        backends=backends.backends_seen,
        peak_rss_mb=report["peak_rss_mb"],
        counters=counters,
        report=report,
    )


def enqueue_rows_per_second(sqlalchemy_url: str, *, count: int, target_url: str) -> float:
    """Insert ``count`` rows through the ORM, one row per committed transaction."""
    engine = create_engine(sqlalchemy_url, pool_size=1)
    try:
        started = time.perf_counter()
        for number in range(count):
            with Session(engine) as session, session.begin():
                session.add(
                    WebhookOutbox(
                        event="bench.event",
                        target_url=target_url,
                        payload={"n": number, "workspace": f"ws-{number % 100}"},
                    )
                )
        return count / (time.perf_counter() - started)
    finally:
        engine.dispose()


def verify(database_url: str, receiver: ReceiverProcess, expected: int) -> list[str]:
    """Every row ``done`` and every key seen by the receiver; return the problems found."""
    problems: list[str] = []
    with psycopg.connect(database_url) as connection:
        statuses: dict[str, int] = dict(connection.execute(f"SELECT status, count(*) FROM {TABLE} GROUP BY status").fetchall())
        keys = {str(row[0]) for row in connection.execute(f"SELECT idempotency_key FROM {TABLE}")}
    if statuses != {"done": expected}:
        problems.append(f"statuses {statuses}, expected {{'done': {expected}}}")
    seen = collections.Counter(receiver.keys())
    duplicates = {key: count for key, count in seen.items() if count > 1}
    missing = keys - set(seen)
    unexpected = set(seen) - keys
    print(f"  receiver saw {sum(seen.values())} requests, {len(seen)} distinct keys; duplicates: {len(duplicates)}"
          + (f" e.g. {list(duplicates.items())[:3]}" if duplicates else ""))
    if missing:
        problems.append(f"{len(missing)} keys never reached the receiver")
    if unexpected:
        problems.append(f"{len(unexpected)} keys the receiver saw are not in the table")
    return problems


@dataclass(frozen=True)
class DrainMode:
    label: str
    parts: str | None  # bench/drain_worker.py --telemetry-parts, or None for no telemetry
    trace_ratio: float = 1.0
    synchronous_commit: bool = True  # OUTBOXKIT_SYNCHRONOUS_COMMIT in the drainer process

    @property
    def traces_everything(self) -> bool:
        return self.parts is not None and "tracing" in self.parts and self.trace_ratio >= 1.0


WITHOUT = DrainMode("without telemetry", None)
TRACED = DrainMode("with telemetry", "metrics,tracing", 1.0)
SAMPLED = DrainMode("with telemetry, 10% of traces sampled", "metrics,tracing", 0.1)
TELEMETRY_MODES = (WITHOUT, TRACED, SAMPLED)
# --commit-rounds: the default (claims and outcomes wait for the WAL flush) against OUTBOXKIT_SYNCHRONOUS_COMMIT=false.
SYNCHRONOUS = DrainMode("synchronous commit", None, synchronous_commit=True)
ASYNCHRONOUS = DrainMode("asynchronous commit", None, synchronous_commit=False)
COMMIT_MODES = (SYNCHRONOUS, ASYNCHRONOUS)
# --telemetry-breakdown: one part at a time, in the same rounds, against the same untraced runs.
BREAKDOWN_MODES = (
    DrainMode("metrics only", "metrics"),
    DrainMode("tracing only, nothing sampled", "tracing", 0.0),
    DrainMode("tracing only, 10% of traces sampled", "tracing", 0.1),
    DrainMode("tracing only, every trace sampled", "tracing", 1.0),
)


def drain_rounds(
    sqlalchemy_url: str, server: str, database: str, database_url: str, receiver: ReceiverProcess, *,
    modes: tuple[DrainMode, ...], rows: int, rounds: int, concurrency: int | None, profile: str | None = None,
) -> tuple[dict[DrainMode, list[DrainRun]], list[str]]:
    """Rounds of one drain in each of ``modes`` on freshly inserted rows; returns ({mode: runs}, problems).

    ``runs[mode][i]`` is round ``i``'s run of that mode.  A round runs the
    modes back to back, starting one mode later each round, so a shared
    host's load swings land on every mode and a round's runs can be
    compared with each other.
    """
    runs: dict[DrainMode, list[DrainRun]] = {mode: [] for mode in modes}
    problems: list[str] = []
    for round_number in range(rounds):
        shift = round_number % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            with psycopg.connect(database_url) as connection:
                connection.execute(f"TRUNCATE {TABLE}")
                connection.commit()
                insert_pending_rows(connection, TABLE, count=rows, target_url=f"{receiver.url}/events")
                vacuum_analyze(connection, TABLE)
            receiver.reset()
            profiled = profile if mode is TRACED and not runs[mode] else None  # the first fully traced run
            run = run_drainer(sqlalchemy_url, server, database, expected=rows, concurrency=concurrency,
                              telemetry_parts=mode.parts, trace_ratio=mode.trace_ratio, profile=profiled,
                              synchronous_commit=mode.synchronous_commit)
            spans = f", {run.report['spans']} spans exported" if "spans" in run.report else ""
            print(f"  {mode.label}: {run.rows_per_s:.0f} rows/s, drainer CPU {run.drainer_cpu_s * 1000 / rows:.3f} ms/row, "
                  f"{run.counters.per_row(rows)}{spans}")
            if mode.traces_everything and run.report.get("spans", 0) < rows:
                problems.append(f"{mode.label}: exported {run.report.get('spans')} spans for {rows} rows")
            problems += verify(database_url, receiver, rows)
            runs[mode].append(run)
    return runs, problems


def paired_ratios(baseline: list[DrainRun], runs: list[DrainRun]) -> list[float]:
    """Each round's rate over the same round's untraced rate."""
    return [run.rows_per_s / plain.rows_per_s for plain, run in zip(baseline, runs, strict=True)]


def median_cpu_ms(runs: list[DrainRun]) -> float:
    return statistics.median(run.drainer_cpu_s * 1000 / run.rows for run in runs)


def commit_durability(
    sqlalchemy_url: str, server: str, database: str, database_url: str, receiver: ReceiverProcess, *,
    rows: int, rounds: int, concurrency: int | None,
) -> tuple[dict[str, float], list[str]]:
    """Step 6: ``rounds`` rounds of a synchronous and an asynchronous drain, interleaved; (summary, problems)."""
    print(f"commit durability: {rounds} round(s) of drains of {rows} bulk-inserted "
          "rows, OUTBOXKIT_SYNCHRONOUS_COMMIT=true (the default) and false, interleaved; "
          f"load average {os.getloadavg()[0]:.2f}")
    by_commit_mode, problems = drain_rounds(
        sqlalchemy_url, server, database, database_url, receiver, modes=COMMIT_MODES,
        rows=rows, rounds=rounds, concurrency=concurrency,
    )
    summary: dict[str, float] = {}
    commit_ratios = paired_ratios(by_commit_mode[ASYNCHRONOUS], by_commit_mode[SYNCHRONOUS])
    for mode, suffix in ((SYNCHRONOUS, "sync_commit"), (ASYNCHRONOUS, "async_commit")):
        runs = by_commit_mode[mode]
        summary[f"drain_rows_per_s_{suffix}"] = round(statistics.median(run.rows_per_s for run in runs), 1)
        summary[f"drain_cpu_ms_per_row_{suffix}"] = round(median_cpu_ms(runs), 3)
        summary[f"commits_per_row_{suffix}"] = round(statistics.median(run.counters.commits / run.rows for run in runs), 2)
        summary[f"wal_syncs_per_row_{suffix}"] = round(
            statistics.median(run.counters.wal_syncs / run.rows for run in runs), 2)
    summary["sync_commit_ratio"] = round(statistics.median(commit_ratios), 3)
    latencies: dict[str, list[float]] = {"sync_commit": [], "async_commit": []}
    for _ in range(rounds):  # interleaved, as the drains
        for suffix in latencies:
            latencies[suffix] += idle_latency(server, rows=IDLE_LATENCY_ROWS, spacing=0.05,
                                              synchronous_commit=suffix == "sync_commit")
    for suffix, values in latencies.items():
        summary[f"idle_latency_p50_ms_{suffix}"] = round(percentile(values, 0.5), 3)
        summary[f"idle_latency_p95_ms_{suffix}"] = round(percentile(values, 0.95), 3)
    print(f"idle latency (commit -> receiver, {IDLE_LATENCY_ROWS} rows 50 ms apart per round, bench/latency.py's "
          f"set-up): p50/p95 {summary['idle_latency_p50_ms_sync_commit']:.2f}/"
          f"{summary['idle_latency_p95_ms_sync_commit']:.2f} ms synchronous, "
          f"{summary['idle_latency_p50_ms_async_commit']:.2f}/{summary['idle_latency_p95_ms_async_commit']:.2f} "
          f"asynchronous (target p95 <= 3 on a quiet host); load average {os.getloadavg()[0]:.2f}")
    print(f"commit durability: median {summary['drain_rows_per_s_sync_commit']:.0f} rows/s synchronous, "
          f"{summary['drain_rows_per_s_async_commit']:.0f} asynchronous; per round synchronous / "
          "asynchronous: " + ", ".join(f"{ratio:.3f}" for ratio in commit_ratios) + " (target >= 0.9); "
          f"load average {os.getloadavg()[0]:.2f}")
    return summary, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drain throughput benchmark (see the module docstring)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows to enqueue and drain (default 20000)")
    parser.add_argument("--slow-rows", type=int, default=3_000, help="rows drained against the 50 ms receiver")
    parser.add_argument("--concurrency", type=int, default=None, help="drain send concurrency (default: the outbox's)")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the fast run's drainer into FILE (collapsed stacks)")
    parser.add_argument("--ceiling-posts", type=int, default=5_000, help="POSTs per httpx ceiling measurement")
    parser.add_argument("--profile-telemetry", metavar="FILE",
                        help="py-spy the first fully traced telemetry run's drainer into FILE (collapsed stacks)")
    parser.add_argument("--telemetry-breakdown", action="store_true",
                        help="also drain with metrics only and with tracing only (nothing, 10%% and every trace "
                             "sampled) in the same rounds, to see what each part costs")
    parser.add_argument("--telemetry-rounds", type=int, default=3,
                        help="rounds of drains without telemetry, with it, and with 10%% of traces sampled (default 3)")
    parser.add_argument("--commit-rounds", type=int, default=2,
                        help="rounds of drains with synchronous commit (the default) and without, interleaved "
                             "(default 2; 0 skips them)")
    parser.add_argument("--commit-only", action="store_true",
                        help="run the commit durability rounds alone (no ceilings, telemetry or slow receiver)")
    arguments = parser.parse_args(argv)
    if arguments.rows < 1 or arguments.slow_rows < 0 or (arguments.concurrency is not None and arguments.concurrency < 1):
        parser.error("--rows must be >= 1, --slow-rows >= 0, --concurrency >= 1")
    if arguments.telemetry_rounds < 1:
        parser.error("--telemetry-rounds must be >= 1")
    if arguments.commit_rounds < 0:
        parser.error("--commit-rounds must be >= 0")
    if arguments.commit_only and arguments.commit_rounds < 1:
        parser.error("--commit-only needs --commit-rounds >= 1")

    scratch = scratch_database(DEFAULT_SERVER)
    server_url, database = scratch.server_url, scratch.name
    database_url, sqlalchemy_url = scratch.database_url, scratch.sqlalchemy_url
    options = WebhookOutbox.__outbox__
    concurrency = arguments.concurrency or options.concurrency

    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    receivers: list[ReceiverProcess] = []
    problems: list[str] = []
    try:
        engine = create_engine(sqlalchemy_url)
        Base.metadata.create_all(engine)
        kit_metadata.create_all(engine)  # the attempt history and pauses a migrated database has
        engine.dispose()
        receiver = ReceiverProcess()
        receivers.append(receiver)
        slow_receiver = ReceiverProcess(delay_ms=50)
        receivers.append(slow_receiver)
        target = f"{receiver.url}/events"
        print(f"database {database}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
              f"rows {arguments.rows}, concurrency {concurrency}, batch {options.batch_size}")
        if arguments.commit_only:
            commit_summary, problems = commit_durability(
                sqlalchemy_url, server_url, database, database_url, receiver, rows=arguments.rows,
                rounds=arguments.commit_rounds, concurrency=arguments.concurrency,
            )
            for problem in problems:
                print(f"PROBLEM: {problem}")
            print(json.dumps(commit_summary))
            return 1 if problems else 0

        httpx_sequential = httpx_posts_per_second(target, count=arguments.ceiling_posts, threads=1)
        httpx_threaded = httpx_posts_per_second(target, count=arguments.ceiling_posts, threads=concurrency)
        receiver.reset()
        print(f"httpx ceiling: {httpx_sequential:.0f} POSTs/s sequential (one thread), "
              f"{httpx_threaded:.0f} POSTs/s with {concurrency} threads sharing one client")
        primitive = primitive_rows_per_second(
            database_url, TABLE, count=arguments.rows, batch_size=options.batch_size, target_url=target
        )
        print(f"primitive ceiling (claim batch of {options.batch_size} with SKIP LOCKED, commit, mark done, commit): "
              f"{primitive:.0f} rows/s")

        enqueue = enqueue_rows_per_second(sqlalchemy_url, count=arguments.rows, target_url=target)
        print(f"enqueue: {enqueue:.0f} rows/s (ORM, one row per transaction, one thread)")
        with psycopg.connect(database_url) as connection:
            vacuum_analyze(connection, TABLE)

        fast = run_drainer(
            sqlalchemy_url,
            server_url,
            database,
            expected=arguments.rows,
            concurrency=arguments.concurrency,
            profile=arguments.profile,
        )
        drain_cpu_ms = fast.drainer_cpu_s * 1000 / fast.rows
        pg_cpu_ms = fast.backend_cpu_s * 1000 / fast.rows
        print(f"drain: {fast.rows_per_s:.0f} rows/s end to end ({fast.report['elapsed_s']:.2f} s, "
              f"{fast.report['batches']} batches, counts {fast.report['counts']})")
        print(f"  drainer CPU {drain_cpu_ms:.3f} ms/row; PostgreSQL CPU {pg_cpu_ms:.3f} ms/row "
              f"(psutil on the {fast.backends} backend(s) serving the bench database); "
              f"all postgres processes: {fast.server_cpu_s * 1000 / fast.rows:.3f} ms/row (includes WAL writer and "
              f"any other session on the server); drainer peak RSS {fast.peak_rss_mb:.1f} MB")
        print(f"  {fast.counters.per_row(fast.rows)}")
        problems += verify(database_url, receiver, arguments.rows)
        # Measured again right after the drain, and the higher of the two
        # kept: on a shared host the first reading may come from a busy
        # moment, and the ratio must not flatter the drain.
        httpx_after = httpx_posts_per_second(target, count=arguments.ceiling_posts, threads=1)
        receiver.reset()
        print(f"httpx ceiling again after the drain: {httpx_after:.0f} POSTs/s sequential")
        httpx_sequential = max(httpx_sequential, httpx_after)
        lower_ceiling = min(httpx_sequential, primitive)
        ratio = fast.rows_per_s / lower_ceiling
        print(f"ratio to the lower ceiling ({lower_ceiling:.0f}/s, the higher httpx reading or the primitive): {ratio:.2f}")

        modes = TELEMETRY_MODES + (BREAKDOWN_MODES if arguments.telemetry_breakdown else ())
        print(f"telemetry: {arguments.telemetry_rounds} round(s) of drains of {arguments.rows} bulk-inserted rows: "
              + "; ".join(mode.label for mode in modes) + " (OutboxMetrics, OutboxTracing: SDK provider, batch processor)")
        by_mode, telemetry_problems = drain_rounds(
            sqlalchemy_url, server_url, database, database_url, receiver, modes=modes,
            rows=arguments.rows, rounds=arguments.telemetry_rounds, concurrency=arguments.concurrency,
            profile=arguments.profile_telemetry,
        )
        problems += telemetry_problems
        plain_runs, traced_runs, sampled_runs = by_mode[WITHOUT], by_mode[TRACED], by_mode[SAMPLED]
        telemetry_ratios, sampled_ratios = paired_ratios(plain_runs, traced_runs), paired_ratios(plain_runs, sampled_runs)
        telemetry_ratio, sampled_ratio = statistics.median(telemetry_ratios), statistics.median(sampled_ratios)
        plain_rate, telemetry_rate, sampled_rate = (
            statistics.median(run.rows_per_s for run in by_mode[mode]) for mode in TELEMETRY_MODES
        )
        best_ratio = max(run.rows_per_s for run in traced_runs) / max(run.rows_per_s for run in plain_runs)
        plain_cpu_ms, telemetry_cpu_ms, sampled_cpu_ms = (median_cpu_ms(by_mode[mode]) for mode in TELEMETRY_MODES)
        print("telemetry: per round, every trace sampled / without: "
              + ", ".join(f"{ratio:.3f}" for ratio in telemetry_ratios)
              + "; 10% sampled / without: " + ", ".join(f"{ratio:.3f}" for ratio in sampled_ratios))
        print(f"telemetry: median {plain_rate:.0f} rows/s without, {telemetry_rate:.0f} with every trace sampled "
              f"(median ratio {telemetry_ratio:.2f}, target >= 0.9; best run against best run {best_ratio:.2f}), "
              f"{sampled_rate:.0f} with 10% sampled (median ratio {sampled_ratio:.2f}); median drainer CPU "
              f"{plain_cpu_ms:.3f}, {telemetry_cpu_ms:.3f}, {sampled_cpu_ms:.3f} ms/row")
        breakdown: dict[str, dict[str, float]] = {}
        for mode in modes[len(TELEMETRY_MODES):]:
            added = median_cpu_ms(by_mode[mode]) - plain_cpu_ms
            part_ratio = statistics.median(paired_ratios(plain_runs, by_mode[mode]))
            print(f"telemetry breakdown: {mode.label}: median ratio {part_ratio:.3f}, drainer CPU {added:+.3f} ms/row")
            breakdown[mode.label] = {"ratio": round(part_ratio, 3), "cpu_ms_per_row_added": round(added, 3)}

        commit_summary = {}
        if arguments.commit_rounds:
            commit_summary, commit_problems = commit_durability(
                sqlalchemy_url, server_url, database, database_url, receiver, rows=arguments.rows,
                rounds=arguments.commit_rounds, concurrency=arguments.concurrency,
            )
            problems += commit_problems

        slow_rate = 0.0
        if arguments.slow_rows:
            with psycopg.connect(database_url) as connection:
                connection.execute(f"TRUNCATE {TABLE}")
                connection.commit()
                insert_pending_rows(connection, TABLE, count=arguments.slow_rows, target_url=f"{slow_receiver.url}/events")
                vacuum_analyze(connection, TABLE)
            slow_target = f"{slow_receiver.url}/events"
            slow_ceiling = httpx_posts_per_second(slow_target, count=min(arguments.slow_rows, 1000), threads=concurrency)
            slow_receiver.reset()
            slow = run_drainer(
                sqlalchemy_url, server_url, database, expected=arguments.slow_rows, concurrency=arguments.concurrency
            )
            slow_rate = slow.rows_per_s
            print(f"slow receiver (50 ms per request): {slow_rate:.0f} rows/s ({slow.report['elapsed_s']:.2f} s, "
                  f"counts {slow.report['counts']}); ideal at concurrency {concurrency}: {concurrency / 0.05:.0f} rows/s; "
                  f"raw httpx, {concurrency} threads, one client, same receiver: {slow_ceiling:.0f} POSTs/s")
            problems += verify(database_url, slow_receiver, arguments.slow_rows)

        print(f"load average at the end: {os.getloadavg()[0]:.2f} (a busy host depresses every rate above)")
        for problem in problems:
            print(f"PROBLEM: {problem}")
        summary: dict[str, object] = {
            "enqueue_rows_per_s": round(enqueue, 1),
            "drain_rows_per_s": round(fast.rows_per_s, 1),
            "drain_cpu_ms_per_row": round(drain_cpu_ms, 3),
            "pg_cpu_ms_per_row": round(pg_cpu_ms, 3),
            "httpx_ceiling_per_s": round(httpx_sequential, 1),
            "primitive_ceiling_per_s": round(primitive, 1),
            "ratio_to_ceiling": round(ratio, 3),
            "slow_receiver_rows_per_s": round(slow_rate, 1),
            "drain_rows_per_s_telemetry_baseline": round(plain_rate, 1),
            "drain_rows_per_s_with_telemetry": round(telemetry_rate, 1),
            "telemetry_ratio": round(telemetry_ratio, 3),
            "telemetry_ratio_best_runs": round(best_ratio, 3),
            "drain_cpu_ms_per_row_telemetry_baseline": round(plain_cpu_ms, 3),
            "drain_cpu_ms_per_row_with_telemetry": round(telemetry_cpu_ms, 3),
            "drain_rows_per_s_with_telemetry_sampled_10pct": round(sampled_rate, 1),
            "telemetry_sampled_10pct_ratio": round(sampled_ratio, 3),
            "drain_cpu_ms_per_row_with_telemetry_sampled_10pct": round(sampled_cpu_ms, 3),
            "rss_mb": round(fast.peak_rss_mb, 1),
            "commits_per_row": round(fast.counters.commits / fast.rows, 2),
            **commit_summary,
        }
        if breakdown:
            summary["telemetry_breakdown"] = breakdown
        print(json.dumps(summary))
        return 1 if problems else 0
    finally:
        for running in receivers:
            running.stop()
        with psycopg.connect(server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
