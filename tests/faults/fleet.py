"""Worker processes for a fault scenario: start, signal, kill, restart, stop.

A ``WorkerFleet`` runs one process per name from a command factory (the
drain worker here; a scheduler worker can use the same fleet).  Each name has
a supervising thread that waits on its process; with ``restart=True`` a
process that dies (however) is started again until the fleet stops, which is
how a process manager treats a crashed worker.  Every exit is recorded with
its return code (``-9`` for SIGKILL).

Workers speak one JSON object per stdout line; the fleet keeps these events
per name (``ready`` marks a process that can be killed meaningfully) and
sends stderr to one log file per incarnation under ``log_dir``.

Processes are started in their own session and are only ever signalled by
pid.  ``stop()`` (also on leaving the context) sends SIGTERM, waits a grace
period, then SIGKILLs what is left, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def worker_environment(overrides: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment without ``OUTBOXKIT_*`` settings, with the repository importable."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOXKIT_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "admin")])
    environment.update(overrides)
    return environment


def drain_worker_command(
    database_url: str, *, idle_poll: float = 0.05, synchronous_commit: str = "off"
) -> Callable[[str], list[str]]:
    """The command factory for ``tests/faults/worker.py`` on one database."""

    def command(name: str) -> list[str]:
        return [
            sys.executable, "-m", "tests.faults.worker",
            "--database-url", database_url, "--name", name, "--idle-poll", str(idle_poll),
            "--synchronous-commit", synchronous_commit,
        ]  # fmt: skip

    return command


def scheduler_worker_command(
    database_url: str, *, tick: float, probe: float, drain_interval: float, heartbeat: float = 0.5
) -> Callable[[str], list[str]]:
    """The command factory for ``tests/faults/scheduler_worker.py`` (elected schedulers) on one database."""

    def command(name: str) -> list[str]:
        return [
            sys.executable, "-m", "tests.faults.scheduler_worker",
            "--database-url", database_url, "--name", name, "--tick", str(tick), "--probe", str(probe),
            "--drain-interval", str(drain_interval), "--heartbeat", str(heartbeat),
        ]  # fmt: skip

    return command


@dataclass(frozen=True)
class Exit:
    """One process that ended."""

    name: str
    pid: int
    returncode: int
    at: float  # time.time()
    during_stop: bool  # ended by the fleet's stop (not already dead then, nor SIGKILLed by a fault before it)


@dataclass
class _Slot:
    name: str
    process: subprocess.Popen[str] | None = None
    incarnations: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class WorkerFleet:
    """Named worker processes under supervision; a context manager."""

    def __init__(
        self,
        command: Callable[[str], list[str]],
        *,
        log_dir: Path,
        environment: Mapping[str, str] | None = None,
        restart: bool = False,
    ) -> None:
        self.command = command
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.environment = dict(environment) if environment is not None else worker_environment()
        self.restart = restart
        self.exits: list[Exit] = []
        self._events: list[dict[str, Any]] = []
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._stopping = False
        # pids a fault SIGKILLed, or found dead when the fleet was told to stop: their exit is a death
        # even when the supervising thread records it after the stop (a busy host can delay that)
        self._died_before_stop: set[int] = set()

    # -- running -------------------------------------------------------------

    def start(self, names: Iterable[str], *, ready_timeout: float = 60.0) -> None:
        """Start one process per name and wait until each says it is ready."""
        started = []
        for name in names:
            if name in self._slots:
                raise ValueError(f"worker {name!r} already exists")
            slot = _Slot(name)
            self._slots[name] = slot
            slot.thread = threading.Thread(target=self._supervise, args=(slot,), name=f"fleet-{name}", daemon=True)
            slot.thread.start()
            started.append(name)
        for name in started:
            self.wait_ready(name, timeout=ready_timeout)

    def _supervise(self, slot: _Slot) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                slot.incarnations += 1
                slot.ready.clear()
                stderr = open(self.log_dir / f"{slot.name}.{slot.incarnations}.log", "w")  # noqa: SIM115
                process = subprocess.Popen(
                    self.command(slot.name),
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env=self.environment,
                    text=True,
                    start_new_session=True,
                )
                slot.process = process
            stderr.close()  # the child holds its own copy
            assert process.stdout is not None
            for line in process.stdout:
                self._read_event(slot, process.pid, line)
            returncode = process.wait()
            with self._lock:
                during_stop = self._stopping and process.pid not in self._died_before_stop
                self.exits.append(Exit(slot.name, process.pid, returncode, time.time(), during_stop))
                if self._stopping or not self.restart:
                    return

    def _read_event(self, slot: _Slot, pid: int, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return  # not an event: a stray print
        if not isinstance(event, dict):
            return
        event.update(name=slot.name, pid=pid)
        with self._lock:
            self._events.append(event)
        if event.get("event") == "ready":
            slot.ready.set()

    def wait_ready(self, name: str, *, timeout: float = 60.0) -> int:
        """Wait until the current process of ``name`` is ready; return its pid."""
        slot = self._slots[name]
        if not slot.ready.wait(timeout):
            raise TimeoutError(f"worker {name!r} was not ready within {timeout}s; see {self.log_dir}")
        with self._lock:
            assert slot.process is not None
            return slot.process.pid

    # -- faults --------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def ready_names(self) -> list[str]:
        """Names whose current process is running and has said it is ready."""
        with self._lock:
            return [
                name
                for name, slot in self._slots.items()
                if slot.ready.is_set() and slot.process is not None and slot.process.poll() is None
            ]

    def send_signal(self, name: str, signum: int) -> int | None:
        """Signal the live process of ``name`` by pid; return the pid, or None if none is running."""
        with self._lock:
            process = self._slots[name].process
            if process is None or process.poll() is not None:
                return None
            if signum == signal.SIGKILL:
                self._slots[name].ready.clear()
                self._died_before_stop.add(process.pid)
            process.send_signal(signum)
            return process.pid

    def kill(self, name: str) -> int | None:
        """SIGKILL the live process of ``name`` (restarted if the fleet restarts)."""
        return self.send_signal(name, signal.SIGKILL)

    def wait_exit(self, name: str, *, timeout: float) -> int | None:
        """Wait for ``name``'s supervision to end (no restart); its last return code, or None on timeout."""
        slot = self._slots[name]
        assert slot.thread is not None
        slot.thread.join(timeout)
        if slot.thread.is_alive():
            return None
        return self.exits_of(name)[-1].returncode

    def current_pid(self, name: str) -> int | None:
        """The pid of ``name``'s live process, or None."""
        with self._lock:
            process = self._slots[name].process
            return process.pid if process is not None and process.poll() is None else None

    def deaths(self) -> list[Exit]:
        """Processes that ended before the fleet was told to stop."""
        with self._lock:
            return [exit for exit in self.exits if not exit.during_stop]

    def exits_of(self, name: str) -> list[Exit]:
        with self._lock:
            return [exit for exit in self.exits if exit.name == name]

    def events(self, kind: str | None = None, *, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                event
                for event in self._events
                if (kind is None or event.get("event") == kind) and (name is None or event["name"] == name)
            ]

    # -- stopping ------------------------------------------------------------

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM every live process, SIGKILL those still running after ``grace`` seconds."""
        with self._lock:
            processes = [slot.process for slot in self._slots.values() if slot.process is not None]
            self._died_before_stop.update(process.pid for process in processes if process.poll() is not None)
            self._stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for slot in self._slots.values():
            if slot.thread is not None:
                slot.thread.join(grace)

    def __enter__(self) -> WorkerFleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
