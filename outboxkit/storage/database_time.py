"""The database server's time: the one clock that due times, leases and cool-downs are decided by.

Every process that drains an outbox or fires a schedule compares times that
other processes wrote (a row's ``next_attempt_at`` and ``claimed_until``, a
destination's ``next_probe_at``, a schedule's ``next_run_at``, a lease's
``expires_at``).  If each used its own host's clock, a host whose clock runs
ahead would claim rows before they are due and take over leases that are
still running elsewhere; one that runs behind would write leases that have
already expired.  So they all decide by one clock, the database server's,
and hosts need no synchronised clocks for correctness.

In SQL, a statement says ``:now`` for the time and ``:lease_until`` for a
lease's end, and ``database_time_sql`` turns them into ``NOW`` and
``LEASE_UNTIL`` (``:lease_seconds`` after ``NOW``), the one place that says
how the time is produced (``NOW_DRIVER`` is ``NOW`` in psycopg's
``%(now)s`` style).  Both read the server's
``now()``, the start of the statement's transaction: each drain statement is
its own transaction (AUTOCOMMIT), so that is the statement's own start, one
instant for every row it touches; and ``now()`` is stable, so
``next_attempt_at <= now()`` stays an index condition (``clock_timestamp()``
is volatile: the planner could not use it to bound an index scan).

Python decides some times itself (a backoff's end, a breaker's cool-down, a
schedule's next fire time from its trigger, how long to sleep, how much of
a lease is left for a send).  ``DatabaseTime`` is the ``Clock`` those
decisions use: ``read(connection)`` takes the server's
``clock_timestamp()`` (the instant of the reading, not of a transaction that
may have started earlier), ``observe`` takes a reading a statement returned
anyway, and ``now()`` is the latest reading advanced by this process's
monotonic clock, counted from when the reading's statement was sent (so it
errs ahead by at most a round trip, never behind), and a step of the host's
wall clock changes nothing.

Tests override the server's time with a ``ManualClock``: ``parameter()``
binds its time to ``:now`` (production binds NULL, and the ``COALESCE``
falls through to ``now()``), and ``now()`` and ``read()`` return it.  Any
other clock (``SystemClock``, a clock of the application's own) stands for
the host's wall clock and is used only before the first reading.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from outboxkit.clock import Clock, ManualClock, SystemClock

__all__ = ["LEASE_UNTIL", "NOW", "NOW_DRIVER", "REFRESH_SECONDS", "DatabaseTime", "database_time_sql"]

NOW = "COALESCE(CAST(:now AS timestamptz), now())"
NOW_DRIVER = "COALESCE(CAST(%(now)s AS timestamptz), now())"
LEASE_UNTIL = f"({NOW} + make_interval(secs => CAST(:lease_seconds AS double precision)))"

# How old a reading may grow before ``refresh`` reads the server's clock again.  Between readings ``now()`` moves
# with this process's monotonic clock, whose rate is off the server's by parts per million (milliseconds an hour).
REFRESH_SECONDS = 30.0

_READ = text("SELECT clock_timestamp()")
_PARAMETERS = re.compile(r"(?<![:\w]):(now|lease_until)\b")


def database_time_sql(sql: str) -> str:
    """``sql`` with its ``:now`` and ``:lease_until`` parameters read from the server's clock (``NOW``, ``LEASE_UNTIL``).

    Bind ``now`` to ``DatabaseTime.parameter()`` (None in production) and ``lease_seconds`` to the lease's length.
    """
    return _PARAMETERS.sub(lambda found: NOW if found.group(1) == "now" else LEASE_UNTIL, sql)


class DatabaseTime:
    """The database server's time as a ``Clock`` (see the module); a ``ManualClock`` stands in for it in tests."""

    def __init__(self, clock: Clock | None = None, *, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.clock: Clock = clock.clock if isinstance(clock, DatabaseTime) else clock or SystemClock()
        self.refresh_seconds = refresh_seconds
        self._reading: tuple[datetime, float] | None = None  # (the server's time, this process's monotonic then)
        self._lock = threading.Lock()

    @property
    def overridden(self) -> bool:
        """Whether a test's ``ManualClock`` stands in for the server's time."""
        return isinstance(self.clock, ManualClock)

    def parameter(self) -> datetime | None:
        """What ``:now`` is bound to: the test's time, or None (the statement reads the server's ``now()``)."""
        return self.clock.now() if self.overridden else None

    def now(self) -> datetime:
        """The server's time now, from the latest reading (the host's clock before any reading)."""
        if self.overridden:
            return self.clock.now()
        with self._lock:
            reading = self._reading
        if reading is None:
            return self.clock.now()
        server, at = reading
        return server + timedelta(seconds=time.monotonic() - at)

    def observe(self, server_now: datetime, *, sent_at: float) -> None:
        """Take a reading of the server's time that a statement returned; ``sent_at`` is ``time.monotonic()`` taken
        before the statement was sent.  The server read its time after that instant, so counting from it makes
        ``now()`` err ahead, by at most the round trip, never behind: a time Python decides (a backoff's end, a
        ``Retry-After``, a cool-down) is never earlier than the server's clock says it should be."""
        if not self.overridden:
            with self._lock:
                self._reading = (server_now, sent_at)

    def read(self, connection: Connection) -> datetime:
        """The server's time, read on ``connection`` (in the caller's transaction, if any); the test's time if overridden."""
        if self.overridden:
            return self.clock.now()
        sent_at = time.monotonic()
        server_now: datetime = connection.execute(_READ).scalar_one()
        self.observe(server_now, sent_at=sent_at)
        return server_now

    def refresh(self, connection: Connection) -> None:
        """Read the server's time on ``connection`` if the latest reading is older than ``refresh_seconds``."""
        if self.overridden:
            return
        with self._lock:
            reading = self._reading
        if reading is None or time.monotonic() - reading[1] >= self.refresh_seconds:
            self.read(connection)

    def __repr__(self) -> str:
        return f"DatabaseTime({self.clock!r})"
