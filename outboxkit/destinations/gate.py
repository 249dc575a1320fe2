"""Where the drain meets destinations: which claimed rows go out, and what their outcomes do to the breaker.

Between the build and the send (``outboxkit.drain.pump``), ``admit`` sorts a
claimed batch by destination and decides, for each destination, from its
stored state.  The claim's own statement says whether every stored state of
the outbox is quiet (healthy, no failure run, neither held nor slowed:
``outboxkit.storage.drain_queries``); then none is read, since a quiet state admits rows as
an absent one does, and otherwise the batch's destinations' states are read
in one statement.  Either way a state another process wrote is seen at this
drainer's next claim.

* **Open, half-open or disabled** (``outboxkit.breaker``): its rows are
  not sent.  They are held (``DestinationStore.hold``): the attempt the claim
  counted is taken back, and they are due again when the hold ends, so a
  destination that is down spends no attempts and costs one claim per row per
  cool-down.  When the cool-down is over, the first of its rows tries to
  become the probe (``DestinationStore.try_probe``, one conditional UPDATE: at
  most one probe per destination across every process); the others are held
  until the probe's lease ends, or until its success releases them at once.
* **Slowed** by a ``Retry-After`` (429, or 503): held until then.
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
  it).  The cap
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

Rows admitted before an outcome closed their destination (queued in the
send pool behind slower sends) are checked again just before their send
(``blocked``): a non-probe row whose destination this drainer now knows to
be open, disabled or slowed is given back unsent, like a held row
(``give_back``).  Another process learns of it at its next claim.

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

With ``OutboxOptions.breaker = None`` no state is read or written and only
the cap (and the rate limit, if set) applies; a destination without a rate
limit reads and writes no bucket.

**What is kept in memory, and for how long.**  Per destination, the gate
keeps the latest stored state it read or wrote and its own view (sends in
flight here, whether it answered this drainer with a success, whether its
last answer here failed).  A destination with no send in flight here that
this drainer has not used (admitted, sent to, recorded) for ``forget_after``
seconds (``FORGET_AFTER_SECONDS``, 10 minutes, or the outbox's lease if that
is longer) is forgotten, so a process that sends to many destinations keeps
only those it used lately.  What is forgotten is what a fresh process starts
without: the stored state is read again at the destination's next claim
(every claim reads it, or finds it quiet, before the gate decides anything
for its rows, so an open, disabled or slowed destination is still held), and
the destination is not yet proven here, so it is capped until its next
success, as in a fresh process.  Everything tied to a claim ends within its
lease (rows waiting over a cap, the recording of an outcome), which is why
the bound is never shorter.  Forgetting is amortised: each use looks at the
destinations least recently used, oldest first, and stops at the first one
used within the bound; one with a send still in flight is looked at again
one bound later.

One module: the gate's decisions (breaker, ``Retry-After``, cap, rate
limit) over one per-destination view kept under one lock; the stored state
(``destinations.store``), the background give-back
(``destinations.claim_release``), the forgetting (``destinations.recent_keys``)
and the rows waiting over a cap (``drain.cap_waiting``) are modules of their own.
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
    """A row cleared to go: its delivery, its destination, and whether it is its destination's probe."""

    row: Outbox
    delivery: Delivery
    destination: str
    probe: bool = False
    granted_at: datetime | None = None  # when its rate-limit token was granted, if its destination has a limit


@dataclass(slots=True)
class Admission:
    """What ``admit`` decided for one claimed batch."""

    sends: list[Send] = field(default_factory=list)
    held: int = 0  # rows of destinations that are open, half-open, disabled or slowed: not sent, attempts kept
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
        self._released = False  # a recorded outcome made held rows due now
        self.releases = ClaimRelease(self.store, self._single_statement, job_name=options.job_name)  # rows over a cap

    def admit(
        self,
        rows: list[tuple[Outbox, Delivery, str]],
        *,
        token: uuid.UUID,
        now: datetime,
        quiet: bool = False,
        keep: int = 0,
    ) -> Admission:
        """Decide which of a claimed batch's rows go out; hold or defer the others (see the module docstring).

        ``quiet``: the claim found every stored state of this outbox's destinations quiet (healthy, no failure
        run, neither held nor slowed), so none is read: a quiet state admits rows as an absent one does.
        ``keep``: how many rows over a cap the caller keeps waiting (``Admission.waiting``); those beyond are
        given back.
        """
        groups = _by_destination(rows)
        states: dict[str, DestinationState] = {}
        if self.breaker is not None:
            states = self._forget(list(groups)) if quiet else self._read_states(list(groups))
        return self._decide(groups, states, token=token, now=now, keep=keep, may_be_alone=True)

    def readmit(
        self, rows: list[tuple[Outbox, Delivery, str]], *, token: uuid.UUID, now: datetime, keep: int
    ) -> Admission:
        """``admit`` for rows of one claim that waited over their cap (``outboxkit.drain.cap_backlog``), on what this
        drainer knows of their destinations: nothing is read (a state another process wrote is seen at the next
        claim, as for every row).  A suspect destination stays capped even with no other send in flight: rows of
        other destinations may still be due (a claim took them beside its own), so it is never alone here."""
        groups = _by_destination(rows)
        with self._lock:
            states = {destination: self._known[destination] for destination in groups if destination in self._known}
        return self._decide(groups, states, token=token, now=now, keep=keep, may_be_alone=False)

    def has_room(self, destination: str, *, now: datetime) -> bool:
        """Whether a row of ``destination`` that waited over its cap could be sent now, on what this drainer knows
        (its state, its sends in flight here): the pump takes the rows waiting for it through ``readmit`` then."""
        clock = self.monotonic()
        with self._lock:
            state = self._known.get(destination)
            if state is not None and state.wait_until(now) is not None:
                return True  # readmit holds them (or makes one the probe) at once
            return self._room(destination, self._use(destination, clock), state, clock, alone=False) > 0

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
        states: dict[str, DestinationState],
        *,
        token: uuid.UUID,
        now: datetime,
        keep: int,
        may_be_alone: bool,
    ) -> Admission:
        admission = Admission()
        for destination, group in groups.items():
            state = states.get(destination)
            probe = False
            if state is not None and state.wait_until(now) is not None:
                group, probe = self._hold_back(destination, state, group, token=token, now=now, admission=admission)
            alone = may_be_alone and len(groups) == 1 and self._alone(destination)
            group = self._within_cap(
                destination, state, group, probe=probe, alone=alone, token=token, now=now, admission=admission,
                keep=keep - len(admission.waiting),
            )
            granted_at = None
            if self.rate_limit is not None and group:
                group, limited = self._within_rate(destination, group, probe=probe, token=token, now=now, admission=admission)
                granted_at = now if limited else None  # the bucket's time of the grant
            admission.sends.extend(
                Send(row, delivery, destination, probe=probe and index == 0, granted_at=granted_at)
                for index, (row, delivery) in enumerate(group)
            )
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
            if before.held_until is not None and after.held_until is None:
                self._released = True
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

    def blocked(self, destination: str, *, now: datetime, granted_at: datetime | None = None) -> bool:
        """Whether this drainer has learnt, since the row was admitted, that its destination must wait.

        Asked by a send thread just before a (non-probe) send: rows admitted
        before an outcome opened the breaker are given back instead of sent,
        and so are rows whose rate-limit token is older than ``GRANT_SECONDS``.
        """
        if granted_at is not None and (now - granted_at).total_seconds() > GRANT_SECONDS:
            return True
        with self._lock:
            known = self._known.get(destination)
        return known is not None and known.wait_until(now) is not None

    def give_back(self, destination: str, row: Outbox, *, token: uuid.UUID, now: datetime) -> None:
        """A row ``blocked`` kept from its send: held like those a claim holds (due now if the hold ended meanwhile)."""
        with self.engine.begin() as connection:
            if self.store.hold(connection, destination, ids=[row.id], token=token, now=now) is None:
                self.store.release(connection, ids=[row.id], token=token, until=now, now=now)

    def take_released(self) -> bool:
        """Whether an outcome recorded here made held rows due now since the last call (the pump claims again)."""
        with self._lock:
            released, self._released = self._released, False
        return released

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

    def _read_states(self, destinations: list[str]) -> dict[str, DestinationState]:
        with self._single_statement() as connection:
            states = self.store.states(connection, destinations)
        self._remember(destinations, states)
        return states

    def _forget(self, destinations: list[str]) -> dict[str, DestinationState]:
        """The claim said every stored state is quiet: known as absent (a quiet state acts as none), nothing read."""
        self._remember(destinations, {})
        return {}

    def _remember(self, destinations: list[str], states: dict[str, DestinationState]) -> None:
        clock = self.monotonic()
        with self._lock:
            for destination in destinations:
                self._use(destination, clock)
                if destination in states:
                    self._known[destination] = states[destination]
                else:
                    self._known.pop(destination, None)

    def _hold_back(
        self,
        destination: str,
        state: DestinationState,
        group: list[tuple[Outbox, Delivery]],
        *,
        token: uuid.UUID,
        now: datetime,
        admission: Admission,
    ) -> tuple[list[tuple[Outbox, Delivery]], bool]:
        """The rows that may still go (the probe first, if this drainer won it), holding the others."""
        probe = False
        if state.probe_due(now):
            first = group[0][0]
            assert first.claimed_until is not None
            with self.engine.begin() as connection:
                probe = self.store.try_probe(connection, destination, row_id=first.id, now=now, probe_until=first.claimed_until)
        waiting = group[1:] if probe else group
        if not waiting:
            return group[:1], probe
        with self.engine.begin() as connection:
            until = self.store.hold(connection, destination, ids=[row.id for row, _ in waiting], token=token, now=now)
        if until is None:  # the destination recovered meanwhile: everything goes
            return group, probe
        admission.held += len(waiting)
        return (group[:1] if probe else []), probe

    def _within_cap(
        self,
        destination: str,
        state: DestinationState | None,
        group: list[tuple[Outbox, Delivery]],
        *,
        probe: bool,
        alone: bool,
        token: uuid.UUID,
        now: datetime,
        admission: Admission,
        keep: int,
    ) -> list[tuple[Outbox, Delivery]]:
        """The rows within the destination's room (``_room``; all of a probe's), registered as in flight; of those
        over it, up to ``keep`` wait (``Admission.waiting``) and the others are given back."""
        if not group:
            return group
        clock = self.monotonic()
        with self._lock:
            local = self._use(destination, clock)
            room = len(group) if probe else self._room(destination, local, state, clock, alone=alone)
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
        probe: bool,
        token: uuid.UUID,
        now: datetime,
        admission: Admission,
    ) -> tuple[list[tuple[Outbox, Delivery]], bool]:
        """The rows that got a token of the destination's rate limit (a probe needs none), and whether it has one."""
        assert self.rate_limit is not None
        per_second = self.rate_limit.per_second_of(destination)
        if per_second is None:
            return group, False
        free, limited = (group[:1], group[1:]) if probe else ([], group)
        if not limited:
            return group, False
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
        return free + limited[: taken.granted], True
