"""Idle latency of outboxkit and of a peer queue, pgqueuer, side by side in one run.

Issue 20 asks for an idle latency p95 <= 3 ms on a quiet host, and for it to
be better than pgqueuer's in the same run.  Both peers get the same work, in
interleaved rounds (by default 3 rounds of 200 rows each, the order of the two
peers swapped every round): rows enqueued one per transaction, 50 ms apart,
from the application's side; for each row, the time from the application's
commit returning to a local HTTP receiver on 127.0.0.1 seeing the request.
Each round of each peer has a receiver of its own (``bench/latency.py``'s),
so each round opens its keep-alive connection afresh, for both peers alike.

* outboxkit, as ``bench/latency.py`` measures it: one kit, elected leader,
  its drain loop and listener started as ``kit.lifespan`` starts them; idle
  (the interval drain at its default 60 s), so only the NOTIFY wake-up
  delivers quickly.  Synchronous commit at the default.  A row is a
  ``WebhookOutbox`` added and committed in its own SQLAlchemy Session.
* pgqueuer 1.6.0, as its documentation runs it: a consumer process of its
  own running ``pgqueuer.run`` (what ``pgq run`` calls, on the event loop
  ``pgq run`` picks: uvloop) over this module's factory ``pgqueuer_worker``:
  a ``PgQueuer`` on its psycopg async driver (``--pgqueuer-driver asyncpg``:
  its asyncpg driver, if asyncpg is installed), one entrypoint whose job
  makes one HTTP POST with a shared ``httpx.AsyncClient``.  pgqueuer's
  defaults otherwise: the NOTIFY wake-up, a 30 s dequeue timeout as the
  polling fallback, durable tables.  Not ``pgq run`` itself: beside this
  project's typer (0.29.2) and click (8.5.1), pgqueuer 1.6.0's ``run``
  command stops before it starts (``setup_fancy_logger``: ``'str' object
  has no attribute 'name'``).  A row is a job enqueued with
  ``SyncQueries.enqueue`` inside a transaction on a psycopg connection of
  the application's own, committed, then timed.

The kit runs in the bench's process, as in ``bench/latency.py`` (its
threads share the interpreter with the enqueuing thread and the receiver);
pgqueuer's consumer has a process of its own.

Both peers share one database, created and dropped by the bench (pgqueuer's
schema installed into it beside outboxkit's tables), and run all along; one
warm-up row each, not counted, shows each is ready before the first round.

Run (needs the optional ``peers`` extra; outboxkit itself does not depend on
pgqueuer)::

    .venv/bin/pip install -e '.[peers]'
    .venv/bin/python bench/peer_latency.py                  # about 1 min 30 s
    .venv/bin/python bench/peer_latency.py --rounds 5 --rows 100
    .venv/bin/pip install asyncpg && .venv/bin/python bench/peer_latency.py --pgqueuer-driver asyncpg

Read pgqueuer's psycopg figures with its driver in mind: the driver waits
for notifications with ``AsyncConnection.notifies(timeout=1.0)``, which
holds the connection's lock, and its queries need that lock too, so a
dequeue woken by one job's NOTIFY tends to wait for the next NOTIFY (or the
1 s timeout); docs/performance.md has the figures of both drivers.

The last line is one JSON object: per peer the p50, p95 and max over all
rounds (``outboxkit_latency_p95_ms``, ``pgqueuer_latency_p95_ms``, ...) and
each round's p95, the rounds and rows per round, pgqueuer's driver, and the 1-minute load
average when the bench started and when it ended.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import httpx  # noqa: E402
import psycopg  # noqa: E402
from exampleapp.models import WebhookOutbox  # noqa: E402
from psycopg.rows import TupleRow  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import Engine, make_url  # noqa: E402

from bench.latency import (  # noqa: E402
    DEFAULT_SERVER,
    LatencyReceiver,
    create_database,
    drop_database,
    measure_commits,
    measure_latency,
    percentile,
)
from outboxkit import OutboxKit, OutboxKitSettings  # noqa: E402
from outboxkit.leader.election import ElectionState  # noqa: E402

try:
    from pgqueuer import AsyncpgDriver, Job, PgQueuer, PsycopgDriver, Queries, run
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.db import Driver, SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries
except ImportError:
    raise SystemExit(
        "bench/peer_latency.py measures pgqueuer beside outboxkit, and pgqueuer is not installed "
        "(outboxkit does not depend on it): .venv/bin/pip install -e '.[peers]'"
    ) from None

ENTRYPOINT = "peer_latency"
PEERS = ("outboxkit", "pgqueuer")


@asynccontextmanager
async def pgqueuer_driver(database_url: str, driver: str) -> AsyncIterator[Driver]:
    """The consumer's one connection, in the pgqueuer driver named (``psycopg`` or ``asyncpg``)."""
    if driver == "asyncpg":
        import asyncpg  # not in the peers extra; main() checks it is installed before it asks for it

        connection = await asyncpg.connect(database_url)
        try:
            yield AsyncpgDriver(connection)
        finally:
            await connection.close()
        return
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as psycopg_connection:
        yield PsycopgDriver(psycopg_connection)


@asynccontextmanager
async def pgqueuer_worker(database_url: str, driver: str) -> AsyncIterator[PgQueuer]:
    """The consumer's factory, as ``pgq run`` takes one: an async context manager that yields the ``PgQueuer``.

    Each job's payload is JSON with the receiver's ``url`` and the row's
    ``key``; the job POSTs the payload there, the key as its Idempotency-Key.
    """
    async with pgqueuer_driver(database_url, driver) as connection, httpx.AsyncClient() as client:
        async def post(job: Job) -> None:
            body = json.loads(job.payload or b"{}")
            response = await client.post(
                body["url"],
                content=job.payload,
                headers={"Idempotency-Key": body["key"], "Content-Type": "application/json"},
            )
            response.raise_for_status()

        queuer = PgQueuer(connection)
        queuer.entrypoint(ENTRYPOINT)(post)  # a call, not a decorator: without pgqueuer installed mypy sees Any
        yield queuer


async def install_pgqueuer(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as connection:
        await Queries.from_psycopg_connection(connection).install()


def run_pgqueuer_worker(database_url: str, driver: str) -> None:
    """The consumer process (``--pgqueuer-worker``): ``pgqueuer.run`` until SIGTERM, on ``pgq run``'s event loop."""
    asyncio_run(run(lambda: pgqueuer_worker(database_url, driver)))


# The consumer process finds the database URL here, not on its command line, where `ps` would show a password.
WORKER_URL_VARIABLE = "OUTBOXKIT_BENCH_PEER_WORKER_DATABASE_URL"


def start_pgqueuer_worker(database_url: str, driver: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--pgqueuer-worker", "--pgqueuer-driver", driver],
        env={**os.environ, WORKER_URL_VARIABLE: database_url},
    )


def stop_pgqueuer_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()  # SIGTERM: pgqueuer.run stops its manager gracefully
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def pgqueuer_round(connection: psycopg.Connection[TupleRow], *, rows: int, spacing: float) -> list[float]:
    """One round of pgqueuer: each job enqueued in a transaction of its own on the application's connection."""
    queries = SyncQueries(SyncPsycopgDriver(connection))
    receiver = LatencyReceiver()

    def enqueue(key: uuid.UUID, n: int) -> None:
        payload = json.dumps({"url": receiver.url, "key": str(key), "n": n}).encode()
        with connection.transaction():
            queries.enqueue(ENTRYPOINT, payload)

    try:
        return measure_commits(enqueue, receiver, rows=rows, spacing=spacing, commits={})
    finally:
        receiver.close()


def outboxkit_round(engine: Engine, *, rows: int, spacing: float) -> list[float]:
    receiver = LatencyReceiver()
    try:
        return measure_latency(engine, receiver, rows=rows, spacing=spacing, commits={})
    finally:
        receiver.close()


def start_elected_kit(engine: Engine, *, tick: float) -> OutboxKit:
    """An idle kit as in bench/latency.py: drain loop and listener started, elected leader."""
    kit = OutboxKit(engine, [WebhookOutbox], settings=OutboxKitSettings(leader_tick_seconds=tick))
    kit.worker.start()
    print(f"waiting one leader tick ({tick:g}s) for the kit to be elected...", flush=True)
    if not kit.scheduler.elect().wait_for(ElectionState.LEADER, timeout=tick + 30):
        raise SystemExit("the kit was never elected")
    listener = kit.worker.listener
    if listener is None or not listener.wait_for_generation(1, timeout=30):
        raise SystemExit("the drain loop's listener never connected")
    return kit


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(latencies, 0.5), 3),
        "p95": round(percentile(latencies, 0.95), 3),
        "max": round(max(latencies), 3),
    }


def describe(label: str, latencies: list[float]) -> str:
    figures = summary(latencies)
    return f"{label}: p50 {figures['p50']:.2f} ms, p95 {figures['p95']:.2f} ms, max {figures['max']:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=os.environ.get("OUTBOXKIT_BENCH_DATABASE_URL", DEFAULT_SERVER))
    # The consumer process; its database URL comes in WORKER_URL_VARIABLE.
    parser.add_argument("--pgqueuer-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200, help="rows per round and peer")
    parser.add_argument("--spacing", type=float, default=0.05, help="seconds between enqueues")
    parser.add_argument("--tick", type=float, default=15.0, help="the kit's leader tick seconds (the real 15)")
    parser.add_argument(
        "--pgqueuer-driver",
        choices=("psycopg", "asyncpg"),
        default="psycopg",
        help="pgqueuer's driver in its consumer (asyncpg: pip install asyncpg first; it is in no extra)",
    )
    options = parser.parse_args()
    if options.pgqueuer_worker:
        run_pgqueuer_worker(os.environ[WORKER_URL_VARIABLE], options.pgqueuer_driver)
        return
    if options.pgqueuer_driver == "asyncpg" and importlib.util.find_spec("asyncpg") is None:
        raise SystemExit("--pgqueuer-driver asyncpg needs asyncpg, which no extra of outboxkit installs: pip install asyncpg")

    load_start = os.getloadavg()[0]
    url = create_database(options.server)
    asyncio.run(install_pgqueuer(url))
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), pool_size=5)
    worker = start_pgqueuer_worker(url, options.pgqueuer_driver)  # starts while the kit waits for its election
    kit = None
    latencies: dict[str, list[list[float]]] = {peer: [] for peer in PEERS}
    try:
        with psycopg.connect(url, autocommit=True) as connection:  # SyncPsycopgDriver wants autocommit
            kit = start_elected_kit(engine, tick=options.tick)
            rounds: dict[str, Callable[[int], list[float]]] = {
                "outboxkit": lambda rows: outboxkit_round(engine, rows=rows, spacing=options.spacing),
                "pgqueuer": lambda rows: pgqueuer_round(connection, rows=rows, spacing=options.spacing),
            }
            for peer in PEERS:  # a warm-up row: the peer is ready (for pgqueuer, its consumer has started)
                if worker.poll() is not None:
                    raise SystemExit(f"the pgqueuer consumer exited with code {worker.returncode}")
                rounds[peer](1)
            for number in range(options.rounds):
                for peer in PEERS if number % 2 == 0 else PEERS[::-1]:
                    latencies[peer].append(rounds[peer](options.rows))
                    print(describe(f"round {number + 1} {peer:<9}", latencies[peer][-1]), flush=True)
                    time.sleep(0.2)  # the peer's writes after its last send, before the other's first row
    finally:
        if kit is not None:
            kit.close()
        stop_pgqueuer_worker(worker)
        engine.dispose()
        drop_database(options.server, url)
    load_end = os.getloadavg()[0]

    print(f"over {options.rounds} rounds of {options.rows} rows (load average {load_start:.2f} -> {load_end:.2f}):")
    figures: dict[str, object] = {}
    for peer in PEERS:
        every_row = [value for one_round in latencies[peer] for value in one_round]
        print(describe(f"  {peer:<9}", every_row))
        for name, value in summary(every_row).items():
            figures[f"{peer}_latency_{name}_ms"] = value
        figures[f"{peer}_round_p95_ms"] = [summary(one_round)["p95"] for one_round in latencies[peer]]
    print(
        json.dumps(
            {
                **figures,
                "rounds": options.rounds,
                "rows_per_round": options.rows,
                "pgqueuer_driver": options.pgqueuer_driver,
                "load_average_1m_start": round(load_start, 2),
                "load_average_1m_end": round(load_end, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
