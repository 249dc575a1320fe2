"""Where the drain meets destinations after the claim: what outcomes do to the breaker.

The claim has already decided, in SQL and for every process, which rows may
go (``outboxkit.storage.destination_claim``): it left out the rows of
destinations that are open, half-open, disabled or slowed, let the probes
through once per cool-down, kept each suspect destination under its cap of
rows in flight and each rate-limited one within its tokens, and shared the
batch across destinations.  What is left here:

**Outcomes** (``record``): the recorder applies a group's outcomes to their
destinations' stored states in the same transaction that writes the rows'
outcomes (``outboxkit.drain.record``), only those that can change a state
(``needs_record``): a success at a destination this drainer knows to be
healthy and proven writes nothing more than the row.  The first success this
drainer sees at a destination it does not know is stored, which proves the
destination to every claim (a destination never proven is suspect, and capped
while others have rows).  An outcome that lets a blocked destination go again
(a probe's success) makes the pump claim at once (``take_unblocked``); the
state change notifies every other process.

With ``OutboxOptions.breaker = None`` no state is written.

**What is kept in memory, and for how long.**  The latest stored state this
drainer wrote for each destination, so healthy successes write nothing more.
A destination it has not used for ``forget_after`` seconds
(``FORGET_AFTER_SECONDS``, 10 minutes, or the outbox's lease if that is
longer) is forgotten (``recent_keys``): its next success is stored once more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine

from outboxkit.breaker import DestinationState, Reading, Signal, Status, signal_of
from outboxkit.destinations.recent_keys import RecentKeys
from outboxkit.destinations.store import DestinationStore, Observation
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import AttemptResult
from outboxkit.telemetry.log_events import log_fields
from outboxkit.transports.base import Delivery

__all__ = ["FORGET_AFTER_SECONDS", "DestinationGate", "Send"]

logger = logging.getLogger(__name__)

# A destination that a drainer has not used for this long (or its outbox's lease, if longer) is forgotten by it.
FORGET_AFTER_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Send:
    """A claimed row on its way: its delivery and its destination."""

    row: Outbox
    delivery: Delivery
    destination: str


class DestinationGate:
    """The drain's destination step for one outbox; thread-safe (several drains of one drainer share it).

    ``monotonic`` is the clock that times how long a destination has been idle (``time.monotonic``; tests pass
    their own).
    """

    def __init__(
        self,
        engine: Engine,
        outbox: type[Outbox],
        *,
        options: OutboxOptions,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.options = options
        self.store = DestinationStore(outbox)
        self.breaker = options.breaker
        self._lock = threading.Lock()
        self.monotonic = monotonic
        self.forget_after = max(FORGET_AFTER_SECONDS, options.lease_seconds)
        self._known: dict[str, DestinationState] = {}  # the latest stored state written here
        self._used: RecentKeys[str] = RecentKeys(self.forget_after)  # the keys of _known
        self._unblocked = False  # an outcome recorded here let a blocked destination's rows go again

    def needs_record(
        self, destination: str, attempt: AttemptResult, *, now: datetime, after_changes: bool = False
    ) -> Reading | None:
        """The reading to store for this outcome, or None when it cannot change the destination's state.

        ``after_changes``: an earlier outcome of the same group changes this destination's state, so what is
        known of it here is not its state when this outcome is applied (a success after a failure is stored).
        """
        if self.breaker is None:
            return None
        reading = signal_of(attempt, now=now)
        if reading is None or after_changes:
            return reading
        with self._lock:
            known = self._known.get(destination)
        quiet = known is not None and (
            known.status == Status.HEALTHY.value and known.consecutive_failures == 0 and known.slowed_until is None
            and known.last_success_at is not None
        )
        if reading.signal is Signal.SUCCESS and reading.slow_down is None and quiet:
            return None
        return reading

    def record(
        self, connection: Connection, destination: str, observations: Sequence[Observation], *, now: datetime
    ) -> None:
        """Apply outcomes, in their order, to the destination's stored state, in the caller's transaction."""
        assert self.breaker is not None
        before, after = self.store.record(connection, destination, observations, now=now, options=self.breaker)
        with self._lock:
            for gone in self._used.use(destination, self.monotonic(), busy=lambda key: False):
                self._known.pop(gone, None)
            if self._used.compact_due():  # most destinations have gone: the table's memory follows those kept
                self._known = dict(self._known)
            self._known[destination] = after
            self._unblocked = self._unblocked or (before.blocked(now) and not after.blocked(now))
        if after.status != before.status:
            # Trouble is a warning; a destination healthy again is news, not something to act on.
            logger.log(
                logging.INFO if after.status == "healthy" else logging.WARNING,
                "%s: destination %s is %s (was %s): %s",
                self.options.job_name,
                destination,
                after.status,
                before.status,
                after.changed_by or "a success",
                extra=log_fields("destination.changed", self.options.job_name, destination=destination,
                                 status=after.status, previous=before.status),
            )

    def take_unblocked(self) -> bool:
        """Whether an outcome recorded here let a blocked destination's rows go again since the last call (a probe
        succeeded): the pump claims again, as the NOTIFY of that change tells every other process."""
        with self._lock:
            unblocked, self._unblocked = self._unblocked, False
        return unblocked

    def remembered(self) -> frozenset[str]:
        """The destinations this drainer keeps a state of in memory now (see the module docstring)."""
        with self._lock:
            return self._used.keys()
