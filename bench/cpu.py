"""CPU accounting for the drain benchmark, with psutil.

``BackendCpu`` follows the PostgreSQL backends that serve one database: a
thread polls ``pg_stat_activity`` (from a connection to another database, so
the poller is not counted) and reads each backend's CPU time.  A backend seen
before ``start()`` counts from its reading then; one that appears later counts
from zero (its start-up is part of the cost).  A backend that exits keeps its
last reading.  This is the figure reported as PostgreSQL CPU: it is the work
done for the drain by the backends it talks to, and nothing else on a shared
server.

``ServerCpu`` is the cruder cross-check: every process of the ``postgres``
user (backends, WAL writer, checkpointer...) plus the postmaster's reaped
children, as a delta.  It includes WAL writing done on the drain's behalf,
but also anything else the server did meanwhile (other databases' sessions).
"""

from __future__ import annotations

import threading

import psutil
import psycopg


def _cpu_seconds(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return times.user + times.system


class BackendCpu:
    """CPU seconds spent by the backends serving ``database`` between ``start()`` and ``stop()``."""

    def __init__(self, server_url: str, database: str, *, interval: float = 0.2) -> None:
        self.server_url = server_url
        self.database = database
        self.interval = interval
        self._baseline: dict[int, float] = {}
        self._latest: dict[int, float] = {}
        self._processes: dict[int, psutil.Process] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._poll_forever, name="backend-cpu", daemon=True)
        self._connection: psycopg.Connection | None = None

    def start(self) -> None:
        self._connection = psycopg.connect(self.server_url, autocommit=True)
        for pid in self._backend_pids():
            seconds = self._read(pid)
            if seconds is not None:
                self._baseline[pid] = seconds
        self._thread.start()

    def stop(self) -> float:
        """Stop polling; return the CPU seconds spent since ``start()``."""
        self._stopped.set()
        self._thread.join()
        self._poll_once()
        assert self._connection is not None
        self._connection.close()
        return sum(latest - self._baseline.get(pid, 0.0) for pid, latest in self._latest.items())

    @property
    def backends_seen(self) -> int:
        return len(self._latest)

    def _poll_forever(self) -> None:
        while not self._stopped.wait(self.interval):
            self._poll_once()

    def _poll_once(self) -> None:
        for pid in self._backend_pids():
            self._read(pid)
        for pid in list(self._processes):
            self._read(pid)

    def _backend_pids(self) -> list[int]:
        assert self._connection is not None
        rows = self._connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
            (self.database,),
        ).fetchall()
        return [row[0] for row in rows]

    def _read(self, pid: int) -> float | None:
        process = self._processes.get(pid)
        if process is None:
            try:
                process = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
            self._processes[pid] = process
        seconds = _cpu_seconds(process)
        if seconds is None:
            self._processes.pop(pid, None)  # exited: keep its last reading
            return None
        self._latest[pid] = seconds
        return seconds


class ServerCpu:
    """CPU seconds of every ``postgres`` process (and reaped children) between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        self._before: dict[int, float] = {}
        self._children_before = 0.0

    def _snapshot(self) -> tuple[dict[int, float], float]:
        readings: dict[int, float] = {}
        children = 0.0
        for process in psutil.process_iter(["username"]):
            if process.info["username"] != "postgres":
                continue
            try:
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            readings[process.pid] = times.user + times.system
            children += times.children_user + times.children_system  # backends that exited, via the postmaster
        return readings, children

    def start(self) -> None:
        self._before, self._children_before = self._snapshot()

    def stop(self) -> float:
        after, children = self._snapshot()
        spent = sum(seconds - self._before.get(pid, 0.0) for pid, seconds in after.items())
        # A process that exited meanwhile is in the postmaster's children total
        # for its whole life: take back what it had spent before start().
        spent -= sum(seconds for pid, seconds in self._before.items() if pid not in after)
        return spent + (children - self._children_before)
