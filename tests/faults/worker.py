"""A drain worker process for the fault suite.

::

    python -m tests.faults.worker --database-url postgresql+psycopg://... --name drain-1

It drains the way an application's worker does, through the public API:
``OutboxKit(engine, [FaultEvent]).drainer(FaultEvent).drain(stop=event)`` in
a loop with a short idle poll, on the system clock, with settings read from
the environment (``OUTBOXKIT_OUTBOXES__FAULT_EVENTS__MAX_ATTEMPTS=3``...).
Its database sessions carry ``application_name=<name>`` and its requests an
``X-Fault-Worker: <name>`` header, so a scenario can find its backends and
its deliveries.  ``--synchronous-commit off`` spares each outcome's commit the
WAL flush wait: the faults here kill workers and sessions, never the server,
and for a running server an acknowledged commit is visible and kept either way.

SIGTERM asks for a graceful stop: sends in flight finish and are recorded,
nothing new is claimed, the process exits 0.  A row whose behaviour is
``poison`` kills the process (SIGKILL to itself) when its send starts, as a
crashing native library would.

Stdout carries one JSON object per line: ``ready``, then on the way out
``stop_requested`` (when the signal was handled, ``time.time()``) and
``stopped`` (the drain counts).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from sqlalchemy import create_engine

from outboxkit import AttemptResult, Delivery, DrainResult, HttpTransport, OutboxKit, Transport
from tests.faults.models import FaultEvent

POISON = "poison"


class PoisonTransport:
    """Wraps a transport; sending a ``poison`` row kills this process on the spot."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        if isinstance(delivery.json, dict) and delivery.json.get("behaviour") == POISON:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.send(delivery, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        self.inner.close()


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def run(database_url: str, name: str, idle_poll: float, synchronous_commit: str) -> int:
    stop = threading.Event()
    stop_requested_at: list[float] = []

    def request_stop(signum: int, frame: object) -> None:
        # Only set a flag here: printing from a signal handler can re-enter stdout.  The flag first, then the
        # time: a claim whose clock reading follows this time must have seen the flag (the drain asks after
        # its reading), which is what the graceful-stop scenario checks.
        first = not stop.is_set()
        stop.set()
        if first:
            stop_requested_at.append(time.time())

    signal.signal(signal.SIGTERM, request_stop)
    connect_args = {"application_name": name, "options": f"-c synchronous_commit={synchronous_commit}"}
    engine = create_engine(database_url, pool_size=2, max_overflow=2, connect_args=connect_args)
    transport = PoisonTransport(HttpTransport(headers={"X-Fault-Worker": name}))
    kit = OutboxKit(engine, [FaultEvent], transport=transport)
    totals = DrainResult(job_name=FaultEvent.__outbox__.job_name)
    try:
        drainer = kit.drainer(FaultEvent)
        emit("ready", name=name, lease=drainer.options.lease_seconds, max_attempts=drainer.policy.max_attempts)
        parent = os.getppid()
        while not stop.is_set():
            if os.getppid() != parent:  # the test runner died without stopping us: do not drain on as an orphan
                break
            result = drainer.drain(stop=stop)
            totals.add(result)
            if result.claimed == 0 or not result.ok:
                stop.wait(idle_poll)
    finally:
        kit.close()
        transport.close()
        engine.dispose()
    if stop_requested_at:
        emit("stop_requested", at=stop_requested_at[0])
    emit("stopped", at=time.time(), counts=totals.as_counts(), errors=len(totals.errors))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--name", required=True, help="application_name of its sessions, X-Fault-Worker header")
    parser.add_argument("--idle-poll", type=float, default=0.05, help="seconds to wait when nothing was due")
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="off skips the WAL flush wait of each commit: same results while the server stays up",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    return run(args.database_url, args.name, args.idle_poll, args.synchronous_commit)


if __name__ == "__main__":
    sys.exit(main())
