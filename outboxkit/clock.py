"""Clocks.

Due times, leases and cool-downs are decided by the database server's clock
(``outboxkit.storage.database_time``), so hosts need no synchronised clocks.
The clock a kit is given is what stands for the present elsewhere (what is
shown and logged) and, when it is a ``ManualClock``, the test's time that
replaces the server's, so tests move time instead of sleeping.
All times are timezone-aware UTC.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable

from outboxkit.errors import InvalidValueError

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime: ...


class SystemClock:
    """The wall clock of this host (UTC).

    Nothing that is due, leased or cooling down is decided by it: those
    follow the database server's clock, whatever this host's says.
    """

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to; for tests.  It stands in for the database server's clock.

    >>> clock = ManualClock(datetime(2030, 1, 1, tzinfo=timezone.utc))
    >>> clock.advance(seconds=5)
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime.now(timezone.utc)
        if start.tzinfo is None:
            raise InvalidValueError("ManualClock needs an aware datetime (tzinfo=timezone.utc)")
        self._now = start.astimezone(timezone.utc)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | None = None, /, **kwargs: float) -> datetime:
        """Move forward by ``delta`` or by ``timedelta(**kwargs)``; return the new time."""
        step = delta if delta is not None else timedelta(**kwargs)
        if step < timedelta(0):
            raise InvalidValueError("a ManualClock only moves forward")
        with self._lock:
            self._now += step
            return self._now

    def set(self, moment: datetime) -> None:
        if moment.tzinfo is None:
            raise InvalidValueError("ManualClock needs an aware datetime")
        with self._lock:
            self._now = moment.astimezone(timezone.utc)

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"
