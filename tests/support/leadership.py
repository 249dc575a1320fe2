"""Helpers for the election, scheduler and NOTIFY tests: polling with a deadline, lock holders, recorders."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from sqlalchemy import Engine

from outboxkit.leader.election import lock_holders
from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY


def wait_until(predicate: Callable[[], object], *, timeout: float = 10.0, message: str = "condition") -> None:
    """Poll ``predicate`` every 20 ms until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} did not happen within {timeout}s")
        time.sleep(0.02)


def holder_count(engine: Engine, key: int = DEFAULT_ADVISORY_LOCK_KEY) -> int:
    """Sessions holding ``key`` in the engine's database (pg_locks with the database predicate)."""
    with engine.connect() as connection:
        return len(lock_holders(connection, key=key))


def terminate_backend(database_url: str, backend_pid: int) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        terminated = connection.execute("SELECT pg_terminate_backend(%s)", [backend_pid]).fetchone()[0]
    assert terminated, f"backend {backend_pid} was not running"


class Recorder:
    """Stands in for a scheduler behind a ``LeaderElection``: counts starts and stops."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._lock = threading.Lock()

    def on_elected(self) -> None:
        with self._lock:
            self.events.append("elected")

    def on_demoted(self, wait: bool) -> None:
        with self._lock:
            self.events.append(f"demoted(wait={wait})")

    def count(self, event: str) -> int:
        with self._lock:
            return self.events.count(event)
