"""When the schedule loop looks at the rows next: a sleep that a wake ends and a re-arm shortens.

The trigger loop (``outboxkit.schedules.runner``) computes its sleep after each
turn from the rows it can fire now.  A schedule whose run is in progress is
not among them (its slot is taken), so the sleep can be longer than that
schedule's next fire time.  When the run ends, it *re-arms* the alarm for
that fire time: the sleep in progress, or the next one, ends by then at the
latest, without a read of the rows.  A *wake* (a NOTIFY, a run that freed a
worker others wait for, ``stop``) ends it at once.  Both are remembered when
they come while the loop is busy with a turn, so none is lost between two
sleeps.  Deadlines are on the monotonic clock: a step of the wall clock moves
none of them.
"""

from __future__ import annotations

import threading
import time

__all__ = ["LoopAlarm"]


class LoopAlarm:
    """The loop's sleep, with ``wake`` (now) and ``rearm`` (within so many seconds) from other threads."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._woken = False
        self._rearmed_at: float | None = None  # the earliest deadline asked for since the last sleep ended

    @property
    def woken(self) -> bool:
        """Whether a wake is pending: the next sleep, or the one in progress, ends at once."""
        with self._condition:
            return self._woken

    def wake(self) -> None:
        """End the sleep in progress, or the next one, at once."""
        with self._condition:
            self._woken = True
            self._condition.notify_all()

    def rearm(self, seconds: float) -> None:
        """End the sleep in progress, or the next one, within ``seconds`` at the latest."""
        deadline = time.monotonic() + max(0.0, seconds)
        with self._condition:
            if self._rearmed_at is None or deadline < self._rearmed_at:
                self._rearmed_at = deadline
            self._condition.notify_all()

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; less when woken, or re-armed for sooner, before or during the sleep."""
        deadline = time.monotonic() + max(0.0, seconds)
        with self._condition:
            try:
                while not self._woken:
                    if self._rearmed_at is not None:
                        deadline = min(deadline, self._rearmed_at)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    self._condition.wait(remaining)
            finally:
                self._woken = False
                self._rearmed_at = None
