"""Wake-up latency and failover timings of the elected scheduler, against a real PostgreSQL.

1. Latency: the leader is idle (interval drain at its default 60 s, so only
   the NOTIFY wake-up can deliver quickly).  200 single rows are enqueued,
   each in its own transaction, 50 ms apart.  For each row: the time from the
   application's commit returning to a local HTTP receiver seeing the
   request.  Target: p95 <= 3 ms on a quiet host.
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
    .venv/bin/python bench/latency.py --steps --skip-failover   # where the milliseconds go

``--steps`` times each step of every row's way in this process (the
listener's wake-up, the pause read, the claim, the send's start, the
receiver) by wrapping the drainer's objects, and reports each step's p50 and
p95 over the rows whose steps all matched.  The report always gives the CPU
time of the kit's drain threads (the drain loop, the listener and the send
threads; ``pthread_getcpuclockid``) per delivered row: the Python work of one
wake-up, whatever the host's load does to the wall clock.

The last line is one JSON object: latency_p50_ms, latency_p95_ms,
latency_max_ms, drain_cpu_ms_per_wake, demote_s, failover_first_job_s (plus
the intervals used, and the step figures with ``--steps``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import psycopg  # noqa: E402
from exampleapp.models import Base, WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine, func, select  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from outboxkit import Delivery, Drainer, OutboxKit, OutboxKitSettings, every  # noqa: E402
from outboxkit.leader.election import ElectionState  # noqa: E402
from outboxkit.storage.notify import install_trigger_sql  # noqa: E402
from outboxkit.storage.tables import job_runs, kit_metadata  # noqa: E402

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


DRAIN_THREAD_PREFIXES = ("outboxkit-drain-", "outboxkit-listener", "outboxkit-send-")


def drain_thread_cpu() -> float:
    """CPU seconds so far of this process's drain threads (loop, listener, senders)."""
    return sum(drain_thread_cpu_by_name().values())


def drain_thread_cpu_by_name() -> dict[str, float]:
    """CPU seconds so far of each of this process's drain threads, by thread name."""
    total: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None or not thread.name.startswith(DRAIN_THREAD_PREFIXES):
            continue
        try:
            total[thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total


class StepTimer:
    """Wraps a drainer's objects to note when each step happens (perf_counter), for ``--steps``."""

    def __init__(self, drainer: Drainer) -> None:
        self.lock = threading.Lock()
        self.wakes: list[float] = []
        self.pause_reads: list[tuple[float, float]] = []
        self.claims: list[tuple[float, float, list[str]]] = []
        self.sends: dict[str, float] = {}
        wake, read, claim = drainer.wake, drainer.pause_check._read, drainer.claimer.claim
        transport = drainer.pump.transport
        send = transport.send

        def timed_wake(*args: Any, **kwargs: Any) -> Any:
            self.wakes.append(time.perf_counter())
            return wake(*args, **kwargs)

        def timed_read(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return read(*args, **kwargs)
            finally:
                self.pause_reads.append((started, time.perf_counter()))

        def timed_claim(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            answer = claim(*args, **kwargs)
            self.claims.append((started, time.perf_counter(), [str(row.idempotency_key) for row in answer[0]]))
            return answer

        def timed_send(delivery: Delivery, *, idempotency_key: str, timeout: float) -> Any:
            self.sends.setdefault(idempotency_key, time.perf_counter())
            return send(delivery, idempotency_key=idempotency_key, timeout=timeout)

        # Instance attributes over the methods, on purpose (the bench times the real objects in place).
        drainer.wake = timed_wake  # type: ignore[method-assign]  # before the listener starts: it takes the bound method then
        drainer.pause_check._read = timed_read  # type: ignore[method-assign]
        drainer.claimer.claim = timed_claim  # type: ignore[method-assign]
        transport.send = timed_send  # type: ignore[method-assign]

    def steps(self, commits: dict[str, float], arrivals: dict[str, float]) -> dict[str, list[float]]:
        """Per step, the milliseconds of each row whose every step was found in order."""
        steps: dict[str, list[float]] = {
            name: [] for name in ("commit_to_wake", "wake_to_claim", "pause_read", "claim", "claim_to_send",
                                  "send_to_receiver", "commit_to_receiver")
        }
        for key, committed in commits.items():
            claim = next((c for c in self.claims if key in c[2]), None)
            if claim is None or key not in self.sends or key not in arrivals:
                continue
            claim_start, claim_end, _ = claim
            wake = next((w for w in self.wakes if committed <= w <= claim_start), None)
            if wake is None:
                continue
            reads = [r for r in self.pause_reads if wake <= r[0] and r[1] <= claim_end]
            sent, arrived = self.sends[key], arrivals[key]
            if not committed <= wake <= claim_start <= claim_end <= sent <= arrived:
                continue
            steps["commit_to_wake"].append(wake - committed)
            steps["wake_to_claim"].append(claim_start - wake)
            steps["pause_read"].append(sum(end - start for start, end in reads))
            steps["claim"].append(claim_end - claim_start)
            steps["claim_to_send"].append(sent - claim_end)
            steps["send_to_receiver"].append(arrived - sent)
            steps["commit_to_receiver"].append(arrived - committed)
        return {name: [value * 1000 for value in values] for name, values in steps.items()}


def measure_commits(
    enqueue: Callable[[uuid.UUID, int], None],
    receiver: LatencyReceiver,
    *,
    rows: int,
    spacing: float,
    commits: dict[str, float],
) -> list[float]:
    """Commit-to-receiver milliseconds of ``rows`` rows, ``spacing`` s apart.

    ``enqueue(key, n)`` commits row ``n`` in a transaction of its own and
    returns once the commit has; the clock starts then. The row's request
    must reach ``receiver`` with ``key`` as its Idempotency-Key.
    """
    for n in range(rows):
        key = uuid.uuid4()
        enqueue(key, n)
        commits[str(key)] = time.perf_counter()
        time.sleep(spacing)
    receiver.wait_for(rows, timeout=60)
    return [(receiver.arrivals[key] - committed) * 1000 for key, committed in commits.items()]


def measure_latency(
    engine: Engine, receiver: LatencyReceiver, *, rows: int, spacing: float, commits: dict[str, float]
) -> list[float]:
    """``measure_commits`` for outboxkit: each row a ``WebhookOutbox`` added and committed in its own Session."""

    def enqueue(key: uuid.UUID, n: int) -> None:
        with Session(engine) as session:
            session.add(WebhookOutbox(idempotency_key=key, event="bench", target_url=receiver.url, payload={"n": n}))
            session.commit()

    return measure_commits(enqueue, receiver, rows=rows, spacing=spacing, commits=commits)


def idle_latency(server: str, *, rows: int, spacing: float, synchronous_commit: bool) -> list[float]:
    """Commit-to-receiver milliseconds of ``rows`` rows enqueued ``spacing`` s apart to an idle drain loop.

    Its own database and receiver, one kit with its drain loop and listener
    (as ``kit.lifespan`` starts them) and the given commit mode; for
    ``bench/drain_throughput.py``'s ``idle_latency_*`` figures.
    """
    url = create_database(server)
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), pool_size=5)
    receiver = LatencyReceiver()
    kit = OutboxKit(engine, [WebhookOutbox], settings=OutboxKitSettings(synchronous_commit=synchronous_commit))
    try:
        kit.worker.start()
        listener = kit.worker.listener
        if listener is None or not listener.wait_for_generation(1, timeout=30):
            raise SystemExit("the drain loop's listener never connected")
        return measure_latency(engine, receiver, rows=rows, spacing=spacing, commits={})
    finally:
        kit.close()
        receiver.close()
        engine.dispose()
        drop_database(server, url)


def measure_failover(engine: Engine, url: str, leader: OutboxKit, standby: OutboxKit) -> tuple[float, float]:
    old = leader.scheduler.election
    if old is None:
        raise SystemExit("the leader has no election")
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
    parser.add_argument("--steps", action="store_true", help="time each step of every row's way (see the docstring)")
    parser.add_argument("--skip-failover", action="store_true", help="measure the latency only")
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
        with warnings.catch_warnings():  # an elected job on purpose: it times the new leader's scheduler
            warnings.filterwarnings("ignore", "kit.scheduler.add_job is deprecated", DeprecationWarning)
            kit.scheduler.add_job("bench.heartbeat", lambda context: None, every(seconds=1))
    timer = StepTimer(leader.drainer(WebhookOutbox)) if options.steps else None
    demote_s = first_job_s = None
    try:
        leader.worker.start()  # the drain loop and its listener, as kit.lifespan starts them in every process
        election = leader.scheduler.elect()
        print(f"waiting one leader tick ({options.tick:g}s) for the leader to start...", flush=True)
        if not election.wait_for(ElectionState.LEADER, timeout=options.tick + 30):
            raise SystemExit("no leader")
        listener = leader.worker.listener
        if listener is None or not listener.wait_for_generation(1, timeout=30):
            raise SystemExit("the drain loop's listener never connected")
        commits: dict[str, float] = {}
        cpu_before = drain_thread_cpu_by_name()
        latencies = measure_latency(engine, receiver, rows=options.rows, spacing=options.spacing, commits=commits)
        time.sleep(0.2)  # the last outcome's write and the loop's due-time read
        cpu_after = drain_thread_cpu_by_name()
        cpu_by_kind: dict[str, float] = {}
        for name, seconds in cpu_after.items():
            kind = name.split("-")[1]
            cpu_by_kind[kind] = cpu_by_kind.get(kind, 0.0) + (seconds - cpu_before.get(name, 0.0)) * 1000 / len(latencies)
        cpu_ms_per_wake = sum(cpu_by_kind.values())
        p50, p95, most = percentile(latencies, 0.5), percentile(latencies, 0.95), max(latencies)
        print(f"commit -> receiver over {len(latencies)} rows: p50 {p50:.2f} ms, p95 {p95:.2f} ms, max {most:.2f} ms")
        print(f"drain threads' CPU per delivered row (one wake-up each): {cpu_ms_per_wake:.3f} ms "
              f"({', '.join(f'{kind} {ms:.3f}' for kind, ms in sorted(cpu_by_kind.items()))})")
        step_figures: dict[str, float | int] = {}
        if timer is not None:
            steps = timer.steps(commits, receiver.arrivals)
            matched = len(steps["commit_to_receiver"])
            print(f"steps, over the {matched} of {len(commits)} rows whose every step matched (ms):")
            step_figures["steps_matched_rows"] = matched
            for name, values in steps.items():
                if values:
                    print(f"  {name:<20} p50 {percentile(values, 0.5):7.3f}  p95 {percentile(values, 0.95):7.3f}")
                    step_figures[f"step_{name}_p50_ms"] = round(percentile(values, 0.5), 3)
                    step_figures[f"step_{name}_p95_ms"] = round(percentile(values, 0.95), 3)
            print(f"  pause reads: {len(timer.pause_reads)}, claims: {len(timer.claims)}, wakes: {len(timer.wakes)}")
            step_figures.update(pause_reads=len(timer.pause_reads), claims=len(timer.claims), wakes=len(timer.wakes))
        if not options.skip_failover:
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
                "drain_cpu_ms_per_wake": round(cpu_ms_per_wake, 3),
                "demote_s": None if demote_s is None else round(demote_s, 3),
                "failover_first_job_s": None if first_job_s is None else round(first_job_s, 3),
                "leader_tick_s": options.tick,
                "standby_probe_s": options.probe,
                "rows": len(latencies),
                "drain_async_commit": options.drain_async_commit,
                "load_average_1m": round(os.getloadavg()[0], 2),
                **step_figures,
            }
        )
    )


if __name__ == "__main__":
    main()
