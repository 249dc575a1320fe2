"""Where the drain meets destinations: which claimed rows go out now, and what their outcomes do to the breaker.

The claim has already left out the rows of destinations that are open,
half-open, disabled or slowed, and let one probe through per cool-down
(``outboxkit.storage.destination_claim``).  Between the build and the send
(``outboxkit.drain.pump``), ``admit`` sorts a claimed batch by destination
and applies what this drainer alone can know, about its own send threads:

* **Suspect** (it has not yet answered this drainer with a success, its
  last attempt here failed, its stored state shows a failure run, or one of
  its sends has been out longer than ``SLOW_SEND_SECONDS``): at most
  ``OutboxOptions.destination_cap`` of its sends are in flight from this
  drainer.  The rows beyond wait in the pump, still claimed
  (``Admission.waiting``, ``outboxkit.drain.cap_backlog``), up to the room the
  pump has for them: when a send to their destination ends, ``readmit``
  takes them through the gate again on what this drainer knows (no read),
  and the first go out.  Rows beyond that room, and waiting rows whose lease
  runs short or whose pump returns (``give_back_over_cap``: one statement
  for all of them, whatever their claims, each row under its own claim
  token), are given back: not sent, their attempts kept, due again one
  ``timeout`` later if the destination is failing, ``SLOW_SEND_SECONDS``
  later if it is slow, and at once (behind the rows already due) if it is
  merely not yet proven.  They are given back from a thread of their own, so
  the pump goes on sending the others meanwhile (the next claim waits for
  it): profiled under load, those
  short transactions on the pump's thread were most of what a hanging
  destination cost the healthy ones, and the rows given back were claimed
  again and again, which is why rows now wait instead.  The cap
  protects the other destinations, so it applies only
  when there are others (in the batch, or with sends in flight): an outbox
  that sends to one receiver sends as before.  A destination proven healthy
  is not capped, so one fast receiver still gets every send thread; a
  receiver that never answers holds at most the cap from its first send
  (among others), and one that starts hanging holds at most what it was sent
  in the second before its sends count as slow.  A destination that is not
  capped (alone, or proven) still has at most ``batch_size`` sends in flight,
  its hung sends included (``outboxkit.drain.hung_sends``): the room a hung send
  leaves in the outbox's concurrency is for the other destinations, never
  for more of its own.

Rows of a batch already claimed when an outcome opens their destination
are still sent (their attempts are counted); no later claim takes its rows.

``record`` applies an outcome to its destination's stored state; the
recorder calls it in the same transaction that writes the row's outcome
(``outboxkit.drain.record``), only when the outcome can change that state:
a success at a destination known to be healthy writes nothing more than the
row, so healthy delivery pays no extra round trip.

**Rate limited** (``OutboxOptions.rate_limit``, ``outboxkit.rate_limits``):
the rows left take a token each from the destination's bucket, shared by
every process (``outboxkit.destinations.rate_store``, one short transaction per
destination and batch); the rows without one are given back unsent, their
attempts kept, due when the bucket will have their token.  A row whose send
thread starts more than ``GRANT_SECONDS`` after its grant is given back too,
which bounds how far sends can bunch up behind their grants.  A probe takes
no token.

With ``OutboxOptions.breaker = None`` no state is written and only
the cap (and the rate limit, if set) applies; a destination without a rate
limit reads and writes no bucket.

**What is kept in memory, and for how long.**  Per destination, the gate
keeps the latest stored state it wrote and its own view (sends in flight
here, whether it answered this drainer with a success, whether its last
answer here failed).  A destination with no send in flight here that this
drainer has not used for ``forget_after`` seconds (``FORGET_AFTER_SECONDS``,
10 minutes, or the outbox's lease if that is longer) is forgotten: it is then
not yet proven here, so it is capped until its next success, as in a fresh
process.  Everything tied to a claim ends within its lease (rows waiting over
a cap, the recording of an outcome), which is why the bound is never shorter.

The stored state (``store``), the background give-back (``claim_release``),
the forgetting (``recent_keys``) and the rows waiting over a cap
(``outboxkit.drain.cap_waiting``) are modules of their own.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine

from outboxkit.breaker import DestinationState, Reading, Signal, Status, signal_of
from outboxkit.destinations.claim_release import ClaimRelease
from outboxkit.destinations.rate_store import RateStore
from outboxkit.destinations.recent_keys import RecentKeys
from outboxkit.destinations.store import DestinationStore
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import AttemptResult
from outboxkit.rate_limits import GRANT_SECONDS
from outboxkit.telemetry.log_events import log_fields
from outboxkit.transports.base import Delivery

__all__ = ["FORGET_AFTER_SECONDS", "SLOW_SEND_SECONDS", "Admission", "DestinationGate", "Send"]

logger = logging.getLogger(__name__)

# A send out longer than this makes its destination suspect (capped), whatever its state says.
SLOW_SEND_SECONDS = 1.0
# A destination with no send in flight that a drainer has not used for this long (or its outbox's lease, if longer)
# is forgotten by that drainer: it keeps nothing of it in memory (see the module docstring).
FORGET_AFTER_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Send:
    """A row cleared to go: its delivery, its destination, and when its rate-limit token was granted."""

    row: Outbox
    delivery: Delivery
    destination: str
    granted_at: datetime | None = None  # when its rate-limit token was granted, if its destination has a limit


@dataclass(slots=True)
class Admission:
    """What ``admit`` decided for one claimed batch."""

    sends: list[Send] = field(default_factory=list)
    capped: int = 0  # rows of suspect destinations beyond their cap, given back: not sent, attempts kept
    # rows of suspect destinations beyond their cap that the caller keeps, claimed, for a place under it
    # (``outboxkit.drain.cap_backlog``): at most the ``keep`` asked for
    waiting: list[tuple[Outbox, Delivery, str]] = field(default_factory=list)
    deferred: int = 0  # rows of rate-limited destinations without a token: not sent, attempts kept


@dataclass(slots=True)
class _Local:
    """This drainer's own view of one destination: its sends in flight and how its last attempt went."""

    in_flight: dict[int, float] = field(default_factory=dict)  # row id -> when handed to the pool (the gate's monotonic clock)
    proven: bool = False  # it answered a send of this drainer with a success
    failing: bool = False  # its last answer here was a failure

    def slow(self, now: float) -> bool:
        return any(now - since > SLOW_SEND_SECONDS for since in self.in_flight.values())

    def suspect(self, state: DestinationState | None, now: float) -> bool:
        return not self.proven or self.failing or self.slow(now) or _failing(state)

    def retry_in(self, state: DestinationState | None, now: float, timeout: float) -> float:
        """When rows over the cap come back: a failing destination frees a place when a send times out,
        a slow one sooner, and one merely not yet proven as soon as an answer comes (they go to the back
        of the due rows, so the next claims take other rows first)."""
        if self.failing or _failing(state):
            return timeout
        return min(SLOW_SEND_SECONDS, timeout) if self.slow(now) else 0.0


def _failing(state: DestinationState | None) -> bool:
    return state is not None and (state.consecutive_failures > 0 or state.status != Status.HEALTHY.value)


def _by_destination(rows: list[tuple[Outbox, Delivery, str]]) -> dict[str, list[tuple[Outbox, Delivery]]]:
    groups: dict[str, list[tuple[Outbox, Delivery]]] = defaultdict(list)
    for row, delivery, destination in rows:
        groups[destination].append((row, delivery))
    return groups


class DestinationGate:
    """The drain's destination step for one outbox; thread-safe (several drains of one drainer share it).

    ``monotonic`` is the clock that times sends in flight and how long a destination has been idle
    (``time.monotonic``; tests pass their own).
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
        self.cap = options.destination_cap
        self.rate_limit = options.rate_limit
        self.rates = RateStore(options.job_name)
        self._lock = threading.Lock()
        self.monotonic = monotonic
        self.forget_after = max(FORGET_AFTER_SECONDS, options.lease_seconds)
        self._known: dict[str, DestinationState] = {}  # the latest stored state read or written here
        self._local: dict[str, _Local] = {}
        self._used: RecentKeys[str] = RecentKeys(self.forget_after)  # the keys of _local (_known's are among them)
        self._unblocked = False  # an outcome recorded here let a blocked destination's rows go again
        self.releases = ClaimRelease(self.store, self._single_statement, job_name=options.job_name)  # rows over a cap

    def admit(self, rows: list[tuple[Outbox, Delivery, str]], *, token: uuid.UUID, now: datetime, keep: int = 0) -> Admission:
        """Decide which of a claimed batch's rows go out now; the others wait or are given back (see the module).

        ``keep``: how many rows over a cap the caller keeps waiting (``Admission.waiting``); those beyond are given
        back.
        """
        return self._decide(_by_destination(rows), token=token, now=now, keep=keep, may_be_alone=True)

    def readmit(
        self, rows: list[tuple[Outbox, Delivery, str]], *, token: uuid.UUID, now: datetime, keep: int
    ) -> Admission:
        """``admit`` for rows of one claim that waited over their cap (``outboxkit.drain.cap_backlog``), on what this
        drainer knows of their destinations.  A suspect destination stays capped even with no other send in flight: rows of
        other destinations may still be due (a claim took them beside its own), so it is never alone here."""
        return self._decide(_by_destination(rows), token=token, now=now, keep=keep, may_be_alone=False)

    def has_room(self, destination: str, *, now: datetime) -> bool:
        """Whether a row of ``destination`` that waited over its cap could be sent now, on what this drainer knows
        (its state, its sends in flight here): the pump takes the rows waiting for it through ``readmit`` then."""
        clock = self.monotonic()
        with self._lock:
            return self._room(destination, self._use(destination, clock), self._known.get(destination), clock, alone=False) > 0

    def give_back_over_cap(self, rows: list[tuple[Outbox, uuid.UUID, str]], *, now: datetime) -> None:
        """Rows that waited over their cap and go back unsent (their lease ran short, or the pump returns), as
        ``(row, claim token, destination)``, of any number of claims: in one statement, each row under its own claim
        token, due again when a row over the cap given back now would be (``_Local.retry_in``)."""
        clock = self.monotonic()
        released: list[tuple[int, uuid.UUID, datetime]] = []
        with self._lock:
            for row, token, destination in rows:
                wait = self._use(destination, clock).retry_in(self._known.get(destination), clock, self.options.timeout)
                released.append((row.id, token, now + timedelta(seconds=wait)))
        self.releases.release(released, now=now)

    def _decide(
        self,
        groups: dict[str, list[tuple[Outbox, Delivery]]],
        *,
        token: uuid.UUID,
        now: datetime,
        keep: int,
        may_be_alone: bool,
    ) -> Admission:
        admission = Admission()
        placed: list[tuple[str, int]] = []  # rows given a place under their destination's cap by this call
        try:
            for destination, group in groups.items():
                with self._lock:
                    state = self._known.get(destination)
                alone = may_be_alone and len(groups) == 1 and self._alone(destination)
                group = self._within_cap(
                    destination, state, group, alone=alone, token=token, now=now, admission=admission,
                    keep=keep - len(admission.waiting),
                )
                placed.extend((destination, row.id) for row, _ in group)
                granted_at = None
                if self.rate_limit is not None and group:
                    group, limited = self._within_rate(destination, group, token=token, now=now, admission=admission)
                    granted_at = now if limited else None  # the bucket's time of the grant
                admission.sends.extend(Send(row, delivery, destination, granted_at=granted_at) for row, delivery in group)
        except BaseException:  # nothing decided here is sent: the places under the caps go back with the caller's
            for destination, row_id in placed:
                self.finished(destination, row_id, None, now=now)
            raise
        return admission

    def finished(self, destination: str, row_id: int, attempt: AttemptResult | None, *, now: datetime) -> None:
        """A send came back (``attempt``) or was not made (None): free its place under the cap, note whether it failed."""
        reading = signal_of(attempt, now=now) if attempt is not None else None
        with self._lock:
            local = self._use(destination, self.monotonic())
            local.in_flight.pop(row_id, None)
            if reading is not None:
                local.failing = reading.signal is Signal.FAILURE
                local.proven = local.proven or reading.signal is Signal.SUCCESS

    def needs_record(self, destination: str, attempt: AttemptResult, *, now: datetime) -> Reading | None:
        """The reading to store for this outcome, or None when it cannot change the destination's state."""
        if self.breaker is None:
            return None
        reading = signal_of(attempt, now=now)
        if reading is None:
            return None
        with self._lock:
            known = self._known.get(destination)
        quiet = known is None or (
            known.status == Status.HEALTHY.value and known.consecutive_failures == 0 and known.slowed_until is None
        )
        if reading.signal is Signal.SUCCESS and reading.slow_down is None and quiet:
            return None
        return reading

    def record(
        self,
        connection: Connection,
        destination: str,
        reading: Reading,
        *,
        row_id: int,
        attempt: AttemptResult,
        error: str | None,
        now: datetime,
    ) -> None:
        """Apply an outcome to the destination's stored state, in the caller's transaction."""
        assert self.breaker is not None
        before, after = self.store.record(
            connection,
            destination,
            reading,
            now=now,
            row_id=row_id,
            error=error,
            status_code=attempt.status_code,
            options=self.breaker,
        )
        with self._lock:
            self._use(destination, self.monotonic())
            self._known[destination] = after
            self._unblocked = self._unblocked or (before.blocked(now) and not after.blocked(now))
        if after.status != before.status:
            logger.warning(
                "%s: destination %s is %s (was %s): %s",
                self.options.job_name,
                destination,
                after.status,
                before.status,
                after.changed_by or "a success",
                extra=log_fields("destination.changed", self.options.job_name, destination=destination,
                                 status=after.status, previous=before.status),
            )

    def _alone(self, destination: str) -> bool:
        """No other destination has a send in flight here: a cap would protect nobody."""
        with self._lock:
            return all(not local.in_flight for name, local in self._local.items() if name != destination)

    def _room(self, destination: str, local: _Local, state: DestinationState | None, clock: float, *, alone: bool) -> int:
        """Under the lock: how many more (non-probe) sends ``destination`` may have in flight here: up to
        ``batch_size`` (hung sends included) if it is alone or not suspect, else up to its cap."""
        if alone or not local.suspect(state, clock):
            # Its hung sends (outboxkit.drain.hung_sends) no longer count against the outbox's in-flight bound, but
            # they count here: the room they leave is for other destinations, never for more of its own.
            return max(0, self.options.batch_size - len(local.in_flight))
        return max(0, self.cap - len(local.in_flight))

    def take_unblocked(self) -> bool:
        """Whether an outcome recorded here let a blocked destination's rows go again since the last call (a probe
        succeeded): the pump claims again, as the NOTIFY of that change tells every other process."""
        with self._lock:
            unblocked, self._unblocked = self._unblocked, False
        return unblocked

    def give_back_unsent(self, destination: str, row: Outbox, *, token: uuid.UUID, now: datetime) -> None:
        """A row ``rate_grant_expired`` kept from its send: given back (its attempt taken back), due now."""
        self.releases.release([(row.id, token, now)], now=now)

    def rate_grant_expired(self, *, now: datetime, granted_at: datetime | None) -> bool:
        """Whether a row's rate-limit token is older than ``GRANT_SECONDS`` (asked just before its send): it is then
        given back rather than sent, which bounds how far sends can bunch up behind their grants."""
        return granted_at is not None and (now - granted_at).total_seconds() > GRANT_SECONDS

    def remembered(self) -> frozenset[str]:
        """The destinations this drainer keeps anything of in memory now (see the module docstring)."""
        with self._lock:
            return self._used.keys()

    def _use(self, destination: str, clock: float) -> _Local:
        """Under the lock: ``destination``'s view here, noted as used at ``clock``; destinations idle for
        ``forget_after`` are forgotten on the way (amortised: the least recently used first, up to the first recent)."""
        local = self._local.get(destination)
        if local is None:
            local = self._local[destination] = _Local()
        # One with a send still out (a hung one) is kept: looked at again one bound later.
        for gone in self._used.use(destination, clock, busy=lambda key: bool(self._local[key].in_flight)):
            del self._local[gone]
            self._known.pop(gone, None)
        if self._used.compact_due():  # most destinations have gone: the tables' memory follows those kept
            self._local, self._known = dict(self._local), dict(self._known)
        return local

    # -- the steps of admit --------------------------------------------------

    def _within_cap(
        self,
        destination: str,
        state: DestinationState | None,
        group: list[tuple[Outbox, Delivery]],
        *,
        alone: bool,
        token: uuid.UUID,
        now: datetime,
        admission: Admission,
        keep: int,
    ) -> list[tuple[Outbox, Delivery]]:
        """The rows within the destination's room (``_room``), registered as in flight; of those
        over it, up to ``keep`` wait (``Admission.waiting``) and the others are given back."""
        if not group:
            return group
        clock = self.monotonic()
        with self._lock:
            local = self._use(destination, clock)
            room = self._room(destination, local, state, clock, alone=alone)
            allowed, over = group[:room], group[room:]
            for row, _ in allowed:
                local.in_flight[row.id] = clock
            wait = local.retry_in(state, clock, self.options.timeout)
        if over and keep > 0:
            admission.waiting.extend((row, delivery, destination) for row, delivery in over[:keep])
            over = over[keep:]
        if over:
            later = now + timedelta(seconds=wait)
            self.releases.release([(row.id, token, later) for row, _ in over], now=now)
            admission.capped += len(over)
        return allowed

    def _single_statement(self) -> Connection:
        """A pooled connection in AUTOCOMMIT for one statement: one round trip, no BEGIN before it, no ROLLBACK or
        COMMIT after it.  Under load each round trip waits for the GIL behind the send threads, so the state read
        that every claimed batch makes, and the give-back of every batch's rows over a cap, cost a third as much."""
        return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def settle(self) -> None:
        """Wait until the rows given back in the background are written (before a claim, so it can take them)."""
        self.releases.settle()

    def close(self) -> None:
        """Write what is still being given back, then stop the background thread."""
        self.releases.close()

    def _within_rate(
        self,
        destination: str,
        group: list[tuple[Outbox, Delivery]],
        *,
        token: uuid.UUID,
        now: datetime,
        admission: Admission,
    ) -> tuple[list[tuple[Outbox, Delivery]], bool]:
        """The rows that got a token of the destination's rate limit, and whether it has one."""
        assert self.rate_limit is not None
        per_second = self.rate_limit.per_second_of(destination)
        if per_second is None:
            return group, False
        limited = group
        with self.engine.begin() as connection:
            taken = self.rates.take(
                connection, destination, len(limited), now=now, per_second=per_second, burst=self.rate_limit.burst_of(per_second)
            )
            over = limited[taken.granted :]
            if over:
                due = [(row.id, token, until) for (row, _), until in zip(over, taken.later, strict=True)]
                self.store.release_claims(connection, due, now=now)
        for row, _ in over:
            self.finished(destination, row.id, None, now=now)  # not sent: no place under the cap
        admission.deferred += len(over)
        return limited[: taken.granted], True
