"""Steps 2 and 3 of the drain, and the pump that keeps them fed: build, send, hand each outcome back.

2. Build.  The application's ``build_delivery`` runs for each row.  An
   exception is one failed attempt for that row only (traceback logged,
   message in ``last_error``); its neighbours go on.

3. Send (no transaction open).  Deliveries run in a bounded thread pool
   (``concurrency``).  Each send has a total deadline, the outbox's
   ``timeout`` (connect, write, the whole answer; ``HttpTransport`` enforces
   it), so a receiver that hangs or drips its answer costs one slot for one
   timeout, never the batch, and no database transaction is held across
   network I/O.  The deadline is also cut to what is left of the row's lease
   (less the time to record the outcome), so a drainer that was paused or
   starved after its claim never sends past its lease.

The pump claims (``outboxkit.drain_claim``), hands the rows to the send pool
and records the outcomes as they come back (``outboxkit.drain_record``), on
the one thread that runs it: those that come back close together are
gathered into one group and written in one transaction (``gather_group``,
bounded by ``OutcomeGrouping``; no wait when no other send is out).  It keeps the pool fed: it claims the next rows
while the previous ones' slowest sends are still out, once no more rows are
in flight than the refill threshold (``refill_threshold``).  After a claim
that took a row alone because its last worker died mid-delivery, nothing more
is claimed until that row is recorded, so a row that kills its worker takes
no freshly claimed neighbour down with it.  The background loop's pump waits
for an outcome, a wake-up or the earliest due time it knows of (``Background``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import traceback
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from sqlalchemy import Engine

from outboxkit.clock import Clock
from outboxkit.diagnostics import SchemaProblemLog
from outboxkit.drain_claim import Claimer, DrainCounts
from outboxkit.drain_record import FinishedSend, OutcomeConnection, OutcomeGrouping, Recorder
from outboxkit.errors import DeliveryBuildError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.queries import OutboxQueries
from outboxkit.send_pool import InFlightLimit, SendPool
from outboxkit.telemetry import Telemetry, log_fields
from outboxkit.transport import Delivery, Transport

__all__ = ["Background", "CallEvents", "PumpState", "SendPump", "gather_group", "refill_threshold"]

logger = logging.getLogger("outboxkit.drain")

# The background loop's timings.  A claim that could not take rows that are
# due (another transaction holds their locks: a concurrent claim for a moment,
# an application transaction for longer), or that this drainer's other drains
# left no in-flight slot for, is retried this soon, doubling while it goes on:
RETRY_CLAIM_SECONDS = 0.05
RETRY_CLAIM_MAX_SECONDS = 5.0
# A send that outlives its deadline by more than this is reported: the lease assumes it cannot.
DEADLINE_SLACK_SECONDS = 1.0
# A send's deadline ends this long before its row's lease (a third of the lease margin, at most 5 s),
# to leave time to record the outcome; with less than MINIMUM_SEND_SECONDS of deadline left (or less
# than the timeout, if that is shorter) the row is not sent but retried.
RECORD_MARGIN_SECONDS = 5.0
MINIMUM_SEND_SECONDS = 0.5

ResultT = TypeVar("ResultT", bound=DrainCounts)


@dataclass
class PumpState:
    """What a pump knows between two events; the background loop keeps it across database errors."""

    in_flight: int = 0  # rows handed to the send pool whose outcome is not yet recorded
    more_due: bool = True  # a claim may find rows: nothing said otherwise since the last empty claim
    isolated: bool = False  # the last claim took an orphaned row alone (see the module docstring)
    next_due: datetime | None = None  # the earliest next_attempt_at known (background loop only)
    retry_wait: float = RETRY_CLAIM_SECONDS  # the next wait for due rows that could not be claimed


_WAKE = object()
_STOP = object()


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
        self._in_flight.give(1)  # nobody will record it: the row's lease brings it back

    def abandon(self) -> None:
        """No more outcomes are read: free the slots of those already queued, and of every later one as it comes."""
        with self._lock:
            self._abandoned = True
            queued = 0
            while True:
                try:
                    self.get_nowait()
                except queue.Empty:
                    break
                queued += 1
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
        self.events.put(_WAKE)

    def woken(self) -> None:
        with self._wake_lock:
            self._wake_queued = False

    def stop(self) -> None:
        self.stopping.set()
        self.events.put(_STOP)

    def wait_seconds(self, state: PumpState, *, blocked: bool, now: datetime) -> float | None:
        """How long to wait for the next event; None waits for an outcome."""
        if blocked:
            return RETRY_CLAIM_SECONDS
        if state.more_due or self.stopping.is_set():
            return None  # in-flight outcomes come first
        if state.next_due is None:
            return self.poll_seconds
        until_due = (state.next_due - now).total_seconds()
        if until_due > 0:
            state.retry_wait = RETRY_CLAIM_SECONDS
            return min(until_due, self.poll_seconds)
        # Rows are due but the last claim took none: locked by another transaction.
        wait, state.retry_wait = state.retry_wait, min(state.retry_wait * 2, RETRY_CLAIM_MAX_SECONDS)
        return min(wait, self.poll_seconds)


class SendPump(Generic[ResultT]):
    """Claims, builds, sends and records for one outbox; owns the send pool and the bound on rows in flight.

    ``end_spell(result)`` is called by the background loop when a busy spell
    ends (nothing in flight, nothing due) and returns the next spell's result.
    """

    def __init__(
        self,
        engine: Engine,
        queries: OutboxQueries,
        *,
        options: OutboxOptions,
        transport: Transport,
        clock: Clock,
        telemetry: Telemetry,
        claimer: Claimer,
        recorder: Recorder,
        schema_problems: SchemaProblemLog,
        end_spell: Callable[[ResultT], ResultT],
        grouping: OutcomeGrouping | None = None,
    ) -> None:
        self.engine = engine
        self.queries = queries
        self.options = options
        self.transport = transport
        self.clock = clock
        self.telemetry = telemetry
        self.claimer = claimer
        self.recorder = recorder
        self._schema_problems = schema_problems
        self._end_spell = end_spell
        self.grouping = grouping or OutcomeGrouping()
        self.senders = SendPool(self.options.concurrency, name=f"outboxkit-send-{self.options.job_name}")
        self.in_flight = InFlightLimit(self.options.batch_size)
        self._refill_at = refill_threshold(self.options.batch_size, self.options.concurrency)
        self._overrun_reported = False
        self._record_margin = min(RECORD_MARGIN_SECONDS, self.options.lease_margin / 3)

    @property
    def job_name(self) -> str:
        return self.options.job_name

    def pump(
        self,
        result: ResultT,
        state: PumpState,
        events: queue.SimpleQueue[object],
        *,
        may_claim: Callable[[], bool],
        background: Background[ResultT] | None,
    ) -> None:
        """Claim, send and record until there is nothing left to do; see the module docstring.

        A call (``background=None``) returns once no claim is due and its
        own sends are recorded.  The background loop waits instead, for an
        outcome, a wake-up or the next due time, and returns only once it is
        stopping with nothing in flight.
        """
        with contextlib.ExitStack() as cleanup:
            outcomes = OutcomeConnection(self.queries, self.engine, cleanup)
            while True:
                may_refill = state.in_flight <= self._refill_at and not (state.isolated and state.in_flight)
                blocked = False
                if state.more_due and may_refill and may_claim():
                    granted = self.in_flight.take(self.options.batch_size - state.in_flight)
                    if granted:
                        self._claim_and_send(granted, state, events, outcomes, result, background, may_claim)
                        continue
                    blocked = True  # this drainer's other drains hold every in-flight slot
                if self.recorder.attempt_log.due(idle=not state.in_flight):
                    self.recorder.flush_attempts(outcomes)
                if background is None:
                    if not state.in_flight:
                        return
                    timeout = None
                else:
                    if background.stopping.is_set() and not state.in_flight:
                        return
                    if not state.in_flight and not state.more_due and result.eventful:
                        # the end of a busy spell: one summary line
                        background.result = result = self._end_spell(result)
                    timeout = background.wait_seconds(state, blocked=blocked, now=self.clock.now())
                try:
                    event = events.get(timeout=timeout)
                except queue.Empty:
                    state.more_due = True  # a row came due (or the safety-net poll)
                    continue
                if not isinstance(event, FinishedSend):
                    _control(event, state, background)
                    continue
                group, control = gather_group(event, events, in_flight=state.in_flight, grouping=self.grouping)
                _control(control, state, background)  # before the write, which may raise: a wake-up is never lost
                state.in_flight -= len(group)
                self.in_flight.give(len(group))
                self._record(group, state, outcomes, result)

    def _claim_and_send(
        self,
        granted: int,
        state: PumpState,
        events: queue.SimpleQueue[object],
        outcomes: OutcomeConnection,
        result: ResultT,
        background: Background[ResultT] | None,
        may_claim: Callable[[], bool],
    ) -> None:
        try:
            rows, token, taken, orphaned = self.claimer.claim(granted, result, may_claim)
        except BaseException:
            self.in_flight.give(granted)
            raise
        self._schema_problems.clear()  # the table is there again
        if background is not None:
            background.failing = None
        # A short claim does not mean nothing is due (parked or isolated rows); an empty one does.
        state.more_due = taken > 0
        state.isolated = orphaned
        if taken:
            state.retry_wait = RETRY_CLAIM_SECONDS
        deliveries, build_failures = self._build(rows)
        self.in_flight.give(granted - len(deliveries))
        timeout = self.options.timeout
        for row, delivery in deliveries:
            key = str(row.idempotency_key)
            self.senders.submit(self._send_one, events, row, token, delivery, key, timeout)
            state.in_flight += 1
        if build_failures:
            failed = [FinishedSend(row, token, failure) for row, failure in build_failures]
            self._record(failed, state, outcomes, result)
        if not state.more_due and background is not None:
            state.next_due = self._earliest_due()

    def _record(
        self, group: list[FinishedSend], state: PumpState, outcomes: OutcomeConnection, result: ResultT
    ) -> None:
        """Write a group's outcomes; a retry it records moves the loop's next due time earlier."""
        for decision in self.recorder.record_group(outcomes.get(), group, result):
            if decision.status == "pending" and decision.next_attempt_at is not None:
                if state.next_due is None or decision.next_attempt_at < state.next_due:
                    state.next_due = decision.next_attempt_at

    def _earliest_due(self) -> datetime | None:
        with self.engine.connect() as connection:
            return self.queries.earliest_due(connection)

    def _send_one(
        self,
        finished: queue.SimpleQueue[object],
        row: Outbox,
        token: uuid.UUID,
        delivery: Delivery,
        key: str,
        timeout: float,
    ) -> None:
        """Runs in the send pool: one delivery, its result handed back to the recording thread.

        The send's deadline is also cut to what is left of the row's lease
        (less the time to record the outcome), so even a drainer that was
        paused or starved after its claim never sends past its lease; a row
        whose lease is nearly over is not sent at all and is retried.
        """
        attempt = None
        started_at = self.clock.now()
        started = time.monotonic()
        probe = self.telemetry.sending(self.job_name, row, delivery, key)  # may add a traceparent header
        try:
            assert row.claimed_until is not None  # the claim stamped it
            lease_left = (row.claimed_until - self.clock.now()).total_seconds() - self._record_margin
            if lease_left < min(timeout, MINIMUM_SEND_SECONDS):
                attempt = AttemptResult(
                    failure=FailureKind.TIMEOUT,
                    error=f"not sent: {max(lease_left, 0):.1f}s of the claim's lease were left when the send could "
                    "start (the process was paused or overloaded); retried",
                )
                return
            timeout = min(timeout, lease_left)
            attempt = self.transport.send(probe.delivery, idempotency_key=key, timeout=timeout)
        except Exception as exc:  # a transport that broke its contract
            attempt = AttemptResult(failure=FailureKind.TRANSPORT, error=f"{type(exc).__name__}: {exc}")
        finally:
            # Always hand something back, or the recording thread would wait for this row forever.
            if attempt is None:
                attempt = AttemptResult(failure=FailureKind.TRANSPORT, error="the send was interrupted")
            probe.sent(attempt)
            finished.put(FinishedSend(row, token, attempt, started_at))
        elapsed = time.monotonic() - started
        if elapsed > timeout + DEADLINE_SLACK_SECONDS and not self._overrun_reported:
            self._overrun_reported = True  # once per drainer: it is a property of the transport
            logger.warning(
                "%s: %s took %.1fs for a %gs deadline; the lease assumes a send ends by its timeout, "
                "so a transport must enforce it (HttpTransport does)",
                self.job_name,
                type(self.transport).__name__,
                elapsed,
                timeout,
                extra=log_fields("drain.deadline_overrun", self.job_name, row),
            )

    def _build(self, rows: list[Outbox]) -> tuple[list[tuple[Outbox, Delivery]], list[tuple[Outbox, AttemptResult]]]:
        deliveries: list[tuple[Outbox, Delivery]] = []
        failures: list[tuple[Outbox, AttemptResult]] = []
        for row in rows:
            try:
                delivery = row.build_delivery()
                if not isinstance(delivery, Delivery):
                    raise DeliveryBuildError(
                        f"{type(row).__name__}.build_delivery returned {type(delivery).__name__}, not Delivery"
                    )
            except Exception as exc:
                logger.error(
                    "%s: build_delivery failed for row %s\n%s", self.job_name, row.id, traceback.format_exc().rstrip(),
                    extra=log_fields("drain.build_failed", self.job_name, row),
                )
                error = f"build_delivery raised {type(exc).__name__}: {exc}"
                failures.append((row, AttemptResult(failure=FailureKind.BUILD, error=error)))
            else:
                deliveries.append((row, delivery))
        return deliveries, failures


def gather_group(
    first: FinishedSend, events: queue.SimpleQueue[object], *, in_flight: int, grouping: OutcomeGrouping
) -> tuple[list[FinishedSend], object | None]:
    """The outcomes to write in one transaction with ``first``, and the control event that ended the gathering.

    ``in_flight`` counts the rows sent whose outcome was not yet taken from
    ``events``, ``first`` included.  Outcomes already queued join at once.
    While other sends are still out, it waits for theirs, at most
    ``grouping.max_delay`` after ``first`` was taken; once every row in
    flight is in the group it stops, so with nothing else pending an
    outcome is written at once.  At most ``grouping.max_rows`` outcomes.
    A wake-up or a stop ends the gathering early and is returned (else
    None), for the pump to act on before it writes.
    """
    group = [first]
    deadline = time.monotonic() + grouping.max_delay
    while len(group) < grouping.max_rows:
        try:
            event = events.get_nowait()
        except queue.Empty:
            remaining = deadline - time.monotonic()
            if len(group) >= in_flight or remaining <= 0:
                break
            try:
                event = events.get(timeout=remaining)
            except queue.Empty:
                break
        if not isinstance(event, FinishedSend):
            return group, event
        group.append(event)
    return group, None


def _control(event: object, state: PumpState, background: Background[typing.Any] | None) -> None:
    """Act on a wake-up (rows may be due) or a stop (the loop sees its flag) taken from the event queue."""
    if event is _WAKE:
        assert background is not None
        background.woken()
        state.more_due = True


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
