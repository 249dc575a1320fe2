"""The pump's state between events, and the background loop's controls and timing.

``PumpState`` is what one pump knows between two events (rows in flight,
whether more may be due, the earliest due time).  ``Background`` holds the
background loop's thread, event queue and stop flag, and decides how long it
waits: for an outcome, a wake-up (NOTIFY, a reset), the earliest due time it
knows of, or the safety-net poll.  ``CallEvents`` is one drain call's outcome
queue.  ``refill_threshold`` says when the pump claims again
(``outboxkit.drain.pump``).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Literal, TypeVar

from outboxkit.drain.claim import DrainCounts
from outboxkit.drain.hung_sends import HungSends
from outboxkit.drain.send_pool import InFlightLimit
from outboxkit.storage.wakeups import RECHECK_MAX_SECONDS, RECHECK_SECONDS

__all__ = [
    "DUE_READ_DELAY_SECONDS",
    "RETRY_CLAIM_MAX_SECONDS",
    "RETRY_CLAIM_SECONDS",
    "STOP",
    "WAKE",
    "Background",
    "CallEvents",
    "PumpState",
    "ResultT",
    "refill_threshold",
]

# The background loop's timings.  A claim that could not take rows that are
# due (another transaction holds their locks: a concurrent claim for a moment,
# an application transaction for longer), or that this drainer's other drains
# left no in-flight slot for, is retried this soon, doubling while it goes on:
RETRY_CLAIM_SECONDS = 0.05
RETRY_CLAIM_MAX_SECONDS = 5.0
# A claim's earliest-due read (``PumpState.due_read``) waits this long at most for an outcome of the
# sends it started, so it never runs beside their start, and a slow send delays it no further:
DUE_READ_DELAY_SECONDS = 0.02

ResultT = TypeVar("ResultT", bound=DrainCounts)

# Events on a loop's queue besides outcomes: a wake-up, and the stop.
WAKE = object()
STOP = object()


@dataclass
class PumpState:
    """What a pump knows between two events; the background loop keeps it across database errors."""

    in_flight: int = 0  # rows handed to the send pool whose outcome is not yet recorded
    hung: int = 0  # of those, sends out past their threshold: not counted against concurrency (outboxkit.drain.hung_sends)
    hung_check_at: float = 0.0  # time.monotonic() when the sends out are next looked at for hung ones
    more_due: bool = True  # a claim may find rows: nothing said otherwise since the last empty claim
    isolated: bool = False  # the last claim took an orphaned row alone (see the module docstring)
    next_due: datetime | None = None  # the earliest next_attempt_at known (background loop only)
    retry_wait: float = RETRY_CLAIM_SECONDS  # the next wait for due rows that could not be claimed
    # The last claim took nothing while sends are out: a destination's cap (counted from live claims) may be what
    # stopped it, so the next outcome, which frees a place under it, is followed by a claim.
    awaiting_outcome: bool = False
    # The earliest due time is still to be read for the last claim ("short": it took fewer rows than it
    # could; "empty": it took none): read once an outcome comes back, nothing is in flight, or
    # DUE_READ_DELAY_SECONDS have passed, so the read does not run beside the start of the claim's
    # sends (``drain_pump.SendPump``).
    due_read: Literal["short", "empty"] | None = None
    # The outbox's pending wake-up (outboxkit.storage.wakeups): the next claim clears it first (a loop that
    # caught up claims again to clear it before it waits), and while an inserting transaction keeps the clear
    # from its lock the loop claims again within RECHECK_MAX_SECONDS.
    clear_first: bool = True
    wakeup_held: bool = False
    recheck_wait: float = RECHECK_SECONDS

    def hung_check_in(self, hung_sends: HungSends, *, now: float | None = None) -> float | None:
        """Seconds until the pump's sends out are next looked at for hung ones (0: now; ``now`` is
        ``time.monotonic()``); None when none can become hung: ``hung_sends`` is off, or every send out is hung already."""
        if not hung_sends.enabled or self.in_flight <= self.hung:
            return None
        return max(0.0, self.hung_check_at - (time.monotonic() if now is None else now))


class CallEvents(queue.SimpleQueue[object]):
    """The outcome queue of one drain call; once the call gave up (a database error), outcomes free their slot instead."""

    def __init__(self, in_flight: InFlightLimit) -> None:
        super().__init__()
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._abandoned = False

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            if not self._abandoned:
                super().put(item, block, timeout)
                return
        if not getattr(item, "hung", False):  # a hung send's slot was freed when it hung
            self._in_flight.give(1)  # nobody will record it: the row's lease brings it back

    def abandon(self) -> None:
        """No more outcomes are read: free the slots of those already queued, and of every later one as it comes."""
        with self._lock:
            self._abandoned = True
            queued = 0
            while True:
                try:
                    item = self.get_nowait()
                except queue.Empty:
                    break
                queued += 0 if getattr(item, "hung", False) else 1
        self._in_flight.give(queued)


class Background(Generic[ResultT]):
    """The background loop's controls: its thread, its event queue, its stop flag, its busy spell's result."""

    def __init__(self, result: ResultT, poll_seconds: float) -> None:
        self.poll_seconds = poll_seconds
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.result = result
        self.failing: str | None = None  # the database error being retried, logged once
        self._wake_lock = threading.Lock()
        self._wake_queued = False
        self.thread: threading.Thread | None = None

    def wake(self) -> None:
        # At most one wake-up waits in the queue: a burst of notifications costs one claim.
        with self._wake_lock:
            if self._wake_queued:
                return
            self._wake_queued = True
        self.events.put(WAKE)

    def woken(self) -> None:
        with self._wake_lock:
            self._wake_queued = False

    def stop(self) -> None:
        self.stopping.set()
        self.events.put(STOP)

    def wait_seconds(self, state: PumpState, *, blocked: bool, now: datetime) -> float | None:
        """How long to wait for the next event; None waits for an outcome."""
        wait = self._wait_seconds(state, blocked=blocked, now=now)
        if state.due_read is None:
            return wait
        return DUE_READ_DELAY_SECONDS if wait is None else min(wait, DUE_READ_DELAY_SECONDS)

    def _wait_seconds(self, state: PumpState, *, blocked: bool, now: datetime) -> float | None:
        if blocked:
            return RETRY_CLAIM_SECONDS
        if state.more_due or self.stopping.is_set():
            return None  # in-flight outcomes come first
        if state.wakeup_held:  # an insert that did not notify may commit any moment: claim again soon
            wait, state.recheck_wait = state.recheck_wait, min(state.recheck_wait * 2, RECHECK_MAX_SECONDS)
            return min(wait, self.poll_seconds)
        if state.next_due is None:
            return self.poll_seconds
        until_due = (state.next_due - now).total_seconds()
        if until_due > 0:
            state.retry_wait = RETRY_CLAIM_SECONDS
            return min(until_due, self.poll_seconds)
        # Rows are due but the last claim took none: locked by another transaction.
        wait, state.retry_wait = state.retry_wait, min(state.retry_wait * 2, RETRY_CLAIM_MAX_SECONDS)
        return min(wait, self.poll_seconds)


def refill_threshold(batch_size: int, concurrency: int) -> int:
    """Claim again once this few rows are left in flight: ``max(concurrency, batch_size // 2)``.

    At least ``concurrency``, so every send thread still has a row while the
    next claim is made, and at least half a batch, so a few rows wait queued
    behind the busy threads: a claim (a round trip, a commit, ORM loading,
    and the GIL shared with the send threads) can take long enough that
    threads finishing meanwhile would otherwise sit idle.  Against
    a 50 ms receiver, refilling at 25 instead of 16 rows kept 14.6-15.0 of 16
    threads busy on average instead of 12.9-14.7, at the cost of smaller
    claims.  Rows in flight never exceed ``batch_size``, so each row is still
    sent within the rounds its lease allows.  When ``concurrency`` is at
    least ``batch_size`` the pool cannot be kept full by one batch, and the
    threshold is half a batch (``batch_size // 2``), below ``concurrency``.
    """
    if concurrency >= batch_size:
        return batch_size // 2  # the pool cannot be kept full; claim at half a batch
    return max(concurrency, batch_size // 2)
