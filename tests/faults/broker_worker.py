"""A drain worker that sends ``SampleEvent`` rows to a broker, and the parent's side that SIGKILLs it mid-batch.

::

    python -m tests.faults.broker_worker postgresql+psycopg://... --transport nats --hold-after-acks 40

It drains with the real ``Drainer`` (``FAULT_OPTIONS``) through the named broker transport and prints one line per
event on stdout: ``ready``, then ``acked key=<idempotency key> duplicate=<0|1>`` after each acknowledgement (1 when
the broker said it already had that id: JetStream's de-duplication at work).  With ``--hold-after-acks N`` the send
that receives the N-th acknowledgement prints ``holding`` and never returns, so its row was accepted by the broker
and its outcome is not written: the parent's SIGKILL then lands between publish and outcome, the case the
de-duplication id is for.  The other sends of the batch go on until the kill.

``kill_mid_batch`` is the parent: it starts workers one after another, SIGKILLs each by its pid once it holds, and
lets a last one drain what is left (the killed workers' rows come back when their leases end).
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine

from outboxkit import AttemptResult, Delivery, Drainer
from outboxkit.transports.base import Transport
from tests.faults.broker_targets import FAULT_OPTIONS, make_transport
from tests.support.models import SampleEvent

__all__ = ["KillReport", "kill_mid_batch"]

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
HOLDING = "holding"


class AnnouncingTransport:
    """Wraps a broker transport; announces each acknowledgement and holds the ``hold_after``-th send forever."""

    def __init__(self, inner: Transport, *, hold_after: int) -> None:
        self.inner = inner
        self.hold_after = hold_after
        self.acks = 0
        self.lock = threading.Lock()

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        result = self.inner.send(delivery, idempotency_key=idempotency_key, timeout=timeout)
        if result.acknowledgement is None:
            return result
        with self.lock:
            self.acks += 1
            duplicate = int("duplicate" in result.acknowledgement)
            print(f"acked key={idempotency_key} duplicate={duplicate}", flush=True)
            hold = self.acks == self.hold_after
            if hold:
                print(HOLDING, flush=True)
        if hold:
            threading.Event().wait()  # accepted by the broker, its outcome never written: the parent kills us
        return result

    def close(self) -> None:
        self.inner.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Drain SampleEvent rows to a broker (fault test worker).")
    parser.add_argument("database_url", help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--transport", required=True)
    parser.add_argument("--hold-after-acks", type=int, default=0, help="hold the send of this acknowledgement (0: never)")
    arguments = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = create_engine(arguments.database_url, pool_size=3, max_overflow=4)
    transport = AnnouncingTransport(make_transport(arguments.transport), hold_after=arguments.hold_after_acks)
    drainer = Drainer(engine, SampleEvent, transport=transport, options=FAULT_OPTIONS)
    try:
        print("ready", flush=True)
        while not stop.is_set():
            if drainer.drain_once().claimed == 0:
                stop.wait(0.05)
        return 0
    finally:
        drainer.close()
        transport.close()
        engine.dispose()


# -- the parent's side -----------------------------------------------------------


@dataclass
class KillReport:
    """What the kills did: how many, and what the workers' lines said."""

    kills: int = 0
    held_at_kills: int = 0  # rows under a live claim at each kill, summed: the most a kill can make the broker resend
    acknowledged: int = 0
    acknowledged_as_duplicates: int = 0  # sends the broker answered "already stored under this id"
    logs: list[str] = field(default_factory=list)


class _Worker:
    def __init__(self, sqlalchemy_url: str, transport: str, hold_after: int, report: KillReport) -> None:
        self.report = report
        self.lines: queue.Queue[str] = queue.Queue()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.broker_worker", sqlalchemy_url, "--transport", transport,
             "--hold-after-acks", str(hold_after)],
            cwd=REPOSITORY_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY_ROOT)},
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.strip()
            if line.startswith("acked "):
                self.report.acknowledged += 1
                self.report.acknowledged_as_duplicates += line.endswith("duplicate=1")
            elif line not in ("ready", HOLDING):
                self.report.logs.append(line)
            self.lines.put(line)

    def wait_for(self, wanted: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if self.lines.get(timeout=max(remaining, 0.01)) == wanted:
                    return
            except queue.Empty:
                pass
            if remaining <= 0 or (self.process.poll() is not None and self.lines.empty()):
                raise AssertionError(f"the worker never printed {wanted!r}; its other lines: {self.report.logs[-20:]}")

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.reader.join(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.reader.join(10)


def kill_mid_batch(
    sqlalchemy_url: str, transport: str, *, kills: int, rng: random.Random, settled: Callable[[], bool],
    claimed: Callable[[], int], timeout: float,
) -> KillReport:
    """SIGKILL ``kills`` workers in turn, each holding a send the broker accepted; a last worker drains until ``settled``.

    ``claimed()`` counts the rows under a live claim, read just before each kill.
    """
    report = KillReport()
    for _ in range(kills):
        worker = _Worker(sqlalchemy_url, transport, rng.randint(5, 60), report)
        try:
            worker.wait_for(HOLDING, timeout)
            report.held_at_kills += claimed()
            worker.kill()
            report.kills += 1
        finally:
            worker.stop()
    last = _Worker(sqlalchemy_url, transport, 0, report)
    try:
        deadline = time.monotonic() + timeout
        while not settled():
            if time.monotonic() > deadline:
                raise AssertionError(f"rows still pending after {timeout:g} s; worker lines: {report.logs[-20:]}")
            if last.process.poll() is not None:
                raise AssertionError(f"the last worker exited ({last.process.returncode}): {report.logs[-20:]}")
            time.sleep(0.2)
    finally:
        last.stop()
    return report


if __name__ == "__main__":
    sys.exit(main())
