"""Reaching into PostgreSQL from the fault side: its clock, and ending a process's sessions.

Both use their own small autocommit connection (never the workers' pools),
guarded by a lock because the receiver calls them from its handler threads.
"""

from __future__ import annotations

import threading
from datetime import datetime

import psycopg

__all__ = ["DatabaseClock", "SessionTerminator"]


class _Connection:
    def __init__(self, url: str, application_name: str) -> None:
        self._connection = psycopg.connect(url, autocommit=True, application_name=application_name)
        self._lock = threading.Lock()

    def fetch_one(self, statement: str, params: tuple[object, ...] | dict[str, object] = ()) -> tuple[object, ...]:
        with self._lock:
            row = self._connection.execute(statement, params).fetchone()
        assert row is not None
        return row

    def close(self) -> None:
        with self._lock:
            self._connection.close()


class DatabaseClock(_Connection):
    """PostgreSQL's ``clock_timestamp()``: the clock the rows' due times are compared with."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "outboxkit-fault-clock")

    def now(self) -> datetime:
        (moment,) = self.fetch_one("SELECT clock_timestamp()")
        assert isinstance(moment, datetime)
        return moment


class SessionTerminator(_Connection):
    """Ends every session of one ``application_name`` in this database (``pg_terminate_backend``)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, "outboxkit-fault-terminator")

    def terminate(self, application_name: str, *, prefix: bool = False, timeout: float = 10.0) -> int:
        """Terminate the sessions and wait until each has exited; return how many there were.

        ``prefix=True`` matches every name that starts with ``application_name``
        (e.g. ``outboxkit-leader:`` for whichever process leads).
        """
        compared = "left(application_name, length(%(name)s))" if prefix else "application_name"
        (terminated,) = self.fetch_one(
            # With a timeout, pg_terminate_backend waits for the backend to exit (PostgreSQL 14+).
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %(wait)s)) FROM pg_stat_activity "
            f"WHERE {compared} = %(name)s AND datname = current_database() AND pid <> pg_backend_pid()",
            {"wait": int(timeout * 1000), "name": application_name},
        )
        assert isinstance(terminated, int)
        return terminated

    def terminate_pid(self, pid: int, *, timeout: float = 10.0) -> bool:
        """Terminate one session by its backend pid and wait until it has exited; whether it was there."""
        (terminated,) = self.fetch_one(
            "SELECT coalesce(bool_or(pg_terminate_backend(pid, %(wait)s)), false) FROM pg_stat_activity "
            "WHERE pid = %(pid)s AND datname = current_database()",
            {"wait": int(timeout * 1000), "pid": pid},
        )
        return bool(terminated)
