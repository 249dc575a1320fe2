"""The schedule runner's time: its clock, checked against the database server's in every deciding transaction.

A runner decides three things by the time: which rows are due (the claim),
which leases have expired (the sweep) and until when its own leases hold
(the renewal).  With the process's clock alone, one host whose clock steps
would get all three wrong for every process: an hour forward and it records
an hour of other processes' occurrences ``missed`` and sweeps their live
leases as expired (a job then overlaps itself); an hour back and its
renewals write leases that have already expired.

So each of those transactions first reads the server's ``clock_timestamp()``
(``check``) between two readings of the process's clock.  While the server's
time falls within ``tolerance`` of that interval (so a slow round trip never
counts as skew), the process's clock is used as it is.  A reading whose two
process readings lie further apart than ``tolerance`` (the process's clock
stepped during it, or the thread stalled) decides by the server's time alone
and leaves the measured offset as it was.  Beyond it, the runner
uses the server's time instead (its clock plus the measured offset, exact to
half a round trip), logs ``schedule.clock_skew`` once, and logs
``schedule.clock_agrees`` when the two agree again.  The database server's
clock is therefore the reference: keep *it* in sync (NTP).

A ``ManualClock`` is a test's time on purpose and is never checked.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from outboxkit.clock import Clock, ManualClock
from outboxkit.telemetry.log_events import log_fields

__all__ = ["CLOCK_TOLERANCE_SECONDS", "CheckedClock"]

CLOCK_TOLERANCE_SECONDS = 2.0

logger = logging.getLogger(__name__)

_DATABASE_NOW = text("SELECT clock_timestamp()")
_NO_CORRECTION = timedelta(0)


class CheckedClock:
    """``clock``, corrected by the database server's time when the two disagree by more than ``tolerance_seconds``.

    ``tolerance_seconds=None`` (and any ``ManualClock``) turns the check off.
    """

    def __init__(self, clock: Clock, *, tolerance_seconds: float | None = CLOCK_TOLERANCE_SECONDS) -> None:
        self.clock = clock
        unchecked = tolerance_seconds is None or isinstance(clock, ManualClock)
        self.tolerance = None if unchecked else timedelta(seconds=tolerance_seconds or 0.0)
        self._correction = _NO_CORRECTION
        self._lock = threading.Lock()

    @property
    def checked(self) -> bool:
        return self.tolerance is not None

    @property
    def correction(self) -> timedelta:
        """What is added to the process's clock now: zero while the two agree."""
        with self._lock:
            return self._correction

    def now(self) -> datetime:
        """The process's clock with the last correction measured (for decisions that commit nothing)."""
        return self.clock.now() + self.correction

    def check(self, connection: Connection) -> datetime:
        """The time to decide by in the caller's transaction, after reading the server's clock in it."""
        if self.tolerance is None:
            return self.clock.now()
        before = self.clock.now()
        database_now = connection.execute(_DATABASE_NOW).scalar_one()
        after = self.clock.now()
        return self.observe(before, database_now, after)

    def observe(self, before: datetime, database_now: datetime, after: datetime) -> datetime:
        """Record one reading of the server's clock taken between ``before`` and ``after``; return the time to use."""
        if self.tolerance is None:
            return after
        if abs(after - before) > self.tolerance:
            # The process's clock stepped while the server's was read (or the thread stalled that long): this
            # reading tells nothing about the offset, and the interval it spans may hold the server's time
            # whatever the step.  Decide by the server's time this once; the next reading measures the offset.
            return database_now
        if before - self.tolerance <= database_now <= after + self.tolerance:
            correction = _NO_CORRECTION
        else:
            correction = database_now - (before + (after - before) / 2)
        with self._lock:
            previous, self._correction = self._correction, correction
        if correction != _NO_CORRECTION and previous == _NO_CORRECTION:
            logger.warning(
                "this process's clock is %+.1f s off the database server's; deciding due and expired times by the "
                "server's clock until they agree again", -correction.total_seconds(),
                extra=log_fields("schedule.clock_skew", offset_seconds=round(-correction.total_seconds(), 3)),
            )
        elif correction == _NO_CORRECTION and previous != _NO_CORRECTION:
            logger.warning(
                "this process's clock agrees with the database server's again; using it",
                extra=log_fields("schedule.clock_agrees"),
            )
        return after + correction
