"""A wall clock that a test can step: the system clock plus an offset, as a host whose clock jumped."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone


class OffsetClock:
    """``datetime.now(UTC) + offset``; ``step(hours=1)`` moves the offset, forward or back, at once."""

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self._offset = offset
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return datetime.now(timezone.utc) + self._offset

    def step(self, delta: timedelta | None = None, /, **kwargs: float) -> None:
        with self._lock:
            self._offset += delta if delta is not None else timedelta(**kwargs)

    @property
    def offset(self) -> timedelta:
        with self._lock:
            return self._offset
