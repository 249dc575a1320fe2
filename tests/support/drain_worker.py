"""A drain worker process for the tests, and the handle tests drive it with.

Run as a script, it drains the ``SampleEvent`` outbox of one database::

    python -m tests.support.drain_worker postgresql+psycopg://... --now 2030-01-01T12:00:00+00:00 --until-idle

and prints one line per event on stdout, so a parent waits on lines instead of
sleeping:

* ``ready pid=<pid>`` once the kit is built (with ``--wait-for-go`` it then
  waits for a ``go`` line on stdin, so several workers start together);
* with ``--report-sends``, ``sending key=<idempotency key>`` when a delivery
  leaves, i.e. after its claim committed;
* ``batch claimed=<n> delivered=<n> retried=<n> stuck=<n> lost_claims=<n> error=<text>``
  after each ``drain_once``;
* ``idle`` when a batch found nothing due (the worker then exits with
  ``--until-idle``);
* ``stopped`` on a clean exit.

``--now`` freezes the worker's clock at that instant (a ``ManualClock``), so a
test decides when rows are due, as it does for in-process drains.
``--poison-kills`` makes the transport SIGKILL its own process when it is
about to send a row whose payload has ``"poison": true``: a delivery that
crashes the worker every time.  Per-outbox options come from the
environment (``OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__...``) through the kit's
settings, as in a real deployment.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sqlalchemy import create_engine

from outboxkit import HttpTransport, ManualClock, OutboxKit, OutboxKitSettings, SystemClock
from outboxkit.policy import AttemptResult
from outboxkit.transports.base import Delivery
from tests.support.models import SampleEvent

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
# libpq options for test engines that commit thousands of outcomes: a commit
# returns before its WAL reaches the disk.  Visibility and locking are
# unchanged; only a crash of the server itself could lose the last commits.
FAST_COMMITS = "-c synchronous_commit=off"


class ReportingTransport:
    """HTTP delivery that announces each send on stdout, and can die on a poison row."""

    def __init__(self, *, poison_kills: bool, report_sends: bool) -> None:
        self._http = HttpTransport()
        self._poison_kills = poison_kills
        self._report_sends = report_sends
        self._print_lock = threading.Lock()

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        if self._report_sends:
            say(f"sending key={idempotency_key}", lock=self._print_lock)
        if self._poison_kills and isinstance(delivery.json, dict) and delivery.json.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)
        return self._http.send(delivery, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        self._http.close()


def say(line: str, *, lock: threading.Lock | None = None) -> None:
    if lock is None:
        print(line, flush=True)
        return
    with lock:
        print(line, flush=True)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Drain the SampleEvent outbox (test worker).")
    parser.add_argument("database_url", help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--now", type=datetime.fromisoformat, help="freeze the clock at this aware ISO instant")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between batches when idle")
    parser.add_argument("--seconds", type=float, help="stop after this many seconds")
    parser.add_argument("--until-idle", action="store_true", help="exit once a batch finds nothing due")
    parser.add_argument("--poison-kills", action="store_true", help='SIGKILL self when sending a "poison" row')
    parser.add_argument("--report-sends", action="store_true", help="print a line for every delivery sent")
    parser.add_argument("--wait-for-go", action="store_true", help="after 'ready', wait for 'go' on stdin")
    parser.add_argument("--application-name", default="outboxkit-test-worker")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    clock = ManualClock(arguments.now) if arguments.now else SystemClock()
    engine = create_engine(
        arguments.database_url,
        pool_size=3,
        max_overflow=2,
        connect_args={"application_name": arguments.application_name, "options": FAST_COMMITS},
    )
    transport = ReportingTransport(poison_kills=arguments.poison_kills, report_sends=arguments.report_sends)
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(), clock=clock, transport=transport)
    try:
        say(f"ready pid={os.getpid()}")
        if arguments.wait_for_go and sys.stdin.readline().strip() != "go":
            return 1
        started = time.monotonic()
        while not stop.is_set():
            result = kit.drain_once(SampleEvent)
            counts = " ".join(f"{name}={value}" for name, value in result.as_counts().items())
            say(f"batch {counts} error={result.error}")
            if result.claimed == 0 and result.ok:
                say("idle")
                if arguments.until_idle:
                    break
            if arguments.seconds is not None and time.monotonic() - started >= arguments.seconds:
                break
            if result.claimed == 0:
                stop.wait(arguments.poll)
        say("stopped")
        return 0
    finally:
        kit.close()
        transport.close()
        engine.dispose()


# -- the parent's side -----------------------------------------------------------


def worker_environment(**outbox_overrides: object) -> dict[str, str]:
    """The environment for a worker: this checkout first on the path, no stray kit settings."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOXKIT_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPOSITORY_ROOT), str(REPOSITORY_ROOT / "admin")])
    for name, value in outbox_overrides.items():
        environment[f"OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__{name.upper()}"] = str(value)
    return environment


class WorkerProcess:
    """A running drain worker whose stdout lines are collected as they arrive."""

    def __init__(self, database_url: str, *arguments: str, environment: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.drain_worker", database_url, *arguments],
            cwd=REPOSITORY_ROOT,
            env=environment or worker_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stderr = ""
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._arrived:
                self.lines.append(line.rstrip("\n"))
                self._arrived.notify_all()
        with self._arrived:
            self._arrived.notify_all()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float = 30.0) -> str:
        """Block until a stdout line satisfies ``predicate``; return it."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"worker {self.pid}: no such line; got {self.lines}; stderr: {self.stderr}")
                self._arrived.wait(timeout=min(remaining, 0.5))

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the worker to exit; return its exit code (negative: killed by that signal)."""
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        self._stderr_reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """SIGKILL the worker (by its pid) and reap it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
        self._reader.join(timeout=5)
        self._stderr_reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    sys.exit(main())
