"""Ordered delivery against unordered, under random 503s (bench/destinations.py runs it; ``--ordered-only`` alone).

20,000 rows over 1,000 keys (``stream``, assigned at random, ids in insert
order), a local receiver that answers 503 to 10% of requests at random (the
rest 200), drained by one ``Drainer`` background loop (``Drainer.start``, as
the kit runs it) with default options except the backoff table: ``(5.0,)``,
the default table's first step without its escalation.  With the default
table a row that draws four 503s in a row waits 5 + 15 + 60 + 300 s, and
among 20,000 rows about two do: both runs would last as long as that one row
and the ratio would say nothing about ordering.  With ``(5.0,)`` every 503
still holds its key for 5 s, which is the cost ordering adds.

The same rows go to two outboxes that differ only in ``ordering_key``
(``stream`` for the ordered one, none for the other), interleaved runs.
``ordered_rows_per_s`` and ``unordered_rows_per_s`` are rows / seconds from
the start of the drain to the last row ``done``; ``ordered_ratio`` their
ratio (target >= 0.7).  ``order_violations`` counts requests of the ordered
run that reached the receiver after a request for a later row of their key
(retries included): 0 means every key was delivered one row at a time in id
order.  The receiver runs in its own process and records each request's key,
row and answer.

Run alone::

    .venv/bin/python bench/destinations.py --ordered-only    # about five minutes on a loaded host
    .venv/bin/python bench/ordered_delivery.py               # the same
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import httpx  # noqa: E402
import psycopg  # noqa: E402
from sqlalchemy import Engine, String, Text, create_engine, func, insert, select, text  # noqa: E402
from sqlalchemy.dialects.postgresql import JSONB  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from outboxkit import Delivery, Drainer, HttpTransport, Outbox, OutboxOptions  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402

ROWS = 20_000
KEYS = 1_000
FAILURE_RATE = 0.10
BACKOFF = (5.0,)


class OrderingBase(DeclarativeBase):
    pass


class _Columns:
    target_url: Mapped[str] = mapped_column(Text)
    stream: Mapped[str | None] = mapped_column(String(20))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json=self.payload)


class OrderedBenchOutbox(_Columns, Outbox, OrderingBase):
    __tablename__ = "bench_ordered_outbox"
    __outbox__ = OutboxOptions(job_name="bench-ordered", backoff=BACKOFF, ordering_key="stream")


class UnorderedBenchOutbox(_Columns, Outbox, OrderingBase):
    __tablename__ = "bench_unordered_outbox"
    __outbox__ = OutboxOptions(job_name="bench-unordered", backoff=BACKOFF)


# -- the receiver (its own process) ---------------------------------------------------


async def _serve(failure_rate: float, seed: int) -> None:
    chance = random.Random(seed)
    log: list[tuple[str, int, int]] = []  # (stream, n, status) in arrival order

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                first = head.split(b"\r\n", 1)[0]
                if first.startswith(b"GET /_log"):
                    answer, status = json.dumps(log).encode(), 200
                elif first.startswith(b"POST /_reset"):
                    log.clear()
                    answer, status = b"", 200
                else:
                    payload = json.loads(body)
                    status = 503 if chance.random() < failure_rate else 200
                    log.append((payload["stream"], payload["n"], status))
                    answer = b""
                reason = b"OK" if status == 200 else b"Service Unavailable"
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
                             % (status, reason, len(answer), answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class FlakyReceiver:
    """This module's receiver in a process of its own: 503 to ``failure_rate`` of requests, a log of them all."""

    def __init__(self, failure_rate: float = FAILURE_RATE) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--failure-rate", str(failure_rate)], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None  # opened as a pipe above
        line = self.process.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"the receiver did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def log(self) -> list[tuple[str, int, int]]:
        return [tuple(entry) for entry in httpx.get(f"{self.url}/_log", timeout=60.0).json()]

    def reset(self) -> None:
        httpx.post(f"{self.url}/_reset", timeout=10.0).raise_for_status()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


# -- the measurement ------------------------------------------------------------------


def order_violations(log: list[tuple[str, int, int]]) -> int:
    """Requests that arrived after a request for a later row of their key."""
    latest: dict[str, int] = {}
    violations = 0
    for stream, n, _ in log:
        if n < latest.get(stream, -1):
            violations += 1
        latest[stream] = max(n, latest.get(stream, -1))
    return violations


def _rows(seed: int) -> list[tuple[str, int]]:
    """(stream, n): each row a random key, ``n`` its place among its key's rows."""
    chance = random.Random(seed)
    counts: defaultdict[str, int] = defaultdict(int)
    rows = []
    for _ in range(ROWS):
        stream = f"s{chance.randrange(KEYS):04d}"
        rows.append((stream, counts[stream]))
        counts[stream] += 1
    return rows


def _scalar(engine: Engine, statement: Any) -> Any:
    with engine.connect() as connection:
        return connection.execute(statement).scalar_one()


def seconds_to_drain(
    engine: Engine, outbox: type[Outbox], *, options: OutboxOptions | None = None, url_prefix: str | None = None,
    timeout: float = 600.0,
) -> float:
    """Seconds until every row of ``outbox`` (those whose URL starts with ``url_prefix``) is done, a drain loop running."""
    pending = select(func.count()).select_from(outbox).where(outbox.status != "done")
    if url_prefix is not None:
        pending = pending.where(outbox.target_url.startswith(url_prefix))  # type: ignore[attr-defined]
    with HttpTransport() as transport:
        drainer = Drainer(engine, outbox, transport=transport, options=options)
        started = time.monotonic()
        drainer.start(poll_seconds=1)
        try:
            while _scalar(engine, pending):
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"rows not delivered within {timeout} s")
                threading.Event().wait(0.1)
            return time.monotonic() - started
        finally:
            drainer.close()


def one_run(engine: Engine, outbox: type[Outbox], receiver: FlakyReceiver, rows: list[tuple[str, int]]) -> float:
    """Rows/s for one outbox: insert every row, start a drain loop, wait for the last row to be done."""
    table = outbox.__table__.name  # type: ignore[attr-defined]  # the mixin's type does not declare the mapped table
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {table}"))
        values = [{"target_url": f"{receiver.url}/ordered", "stream": stream, "payload": {"stream": stream, "n": n}}
                  for stream, n in rows]
        for start in range(0, len(values), 5_000):
            connection.execute(insert(outbox), values[start : start + 5_000])
        connection.execute(text(f"ANALYZE {table}"))
    receiver.reset()
    elapsed = seconds_to_drain(engine, outbox)
    return len(rows) / elapsed


def ordered_vs_unordered(engine: Engine, *, repeat: int = 1) -> dict[str, object]:
    """The figures of this module (see its docstring), ``repeat`` interleaved pairs, medians reported."""
    OrderingBase.metadata.create_all(engine)
    receiver = FlakyReceiver()
    ordered, unordered, violations = [], [], 0
    try:
        for run in range(repeat):
            rows = _rows(seed=run)
            unordered.append(one_run(engine, UnorderedBenchOutbox, receiver, rows))
            ordered.append(one_run(engine, OrderedBenchOutbox, receiver, rows))
            violations += order_violations(receiver.log())
            print(f"ordered delivery: {ordered[-1]:.1f} rows/s ordered, {unordered[-1]:.1f} unordered "
                  f"({ordered[-1] / unordered[-1]:.2f})", flush=True)
    finally:
        receiver.stop()
        OrderingBase.metadata.drop_all(engine)
    ordered_rate, unordered_rate = statistics.median(ordered), statistics.median(unordered)
    return {
        "ordered_ratio_per_pair": [round(one / other, 3) for one, other in zip(ordered, unordered, strict=True)],
        "ordered_rows_per_s": round(ordered_rate, 1),
        "unordered_rows_per_s": round(unordered_rate, 1),
        "ordered_ratio": round(ordered_rate / unordered_rate, 3),
        "ordered_ratio_target": 0.7,
        "order_violations": violations,
        "ordered_rows": ROWS,
        "ordered_keys": KEYS,
        "ordered_failure_rate": FAILURE_RATE,
        "ordered_backoff_s": list(BACKOFF),
    }


def run_ordered_only(*, repeat: int = 1) -> dict[str, object]:
    """The ordered-vs-unordered figures alone, on a scratch database of their own."""
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=10)
    try:
        kit_metadata.create_all(engine)
        return ordered_vs_unordered(engine, repeat=repeat)
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the receiver's process
    parser.add_argument("--failure-rate", type=float, default=FAILURE_RATE, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        asyncio.run(_serve(options.failure_rate, seed=17))
        return
    print(json.dumps(run_ordered_only()))


if __name__ == "__main__":
    main()
