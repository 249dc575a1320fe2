"""The drain: claim due rows, deliver them, record each outcome.

A drain works in four steps.  Each step names the invariant it protects.

1. Claim (one short transaction).  Up to ``batch_size`` due rows are taken
   oldest first with ``FOR UPDATE SKIP LOCKED``; each gets a lease
   (``claimed_until``), the batch's fresh ``claim_token``, and its attempt is
   counted; then the transaction commits.
   *Disjoint claims*: two drains, in one process or two, never get the same
   row while its lease runs.  *Claim before send*: the attempt is committed
   before any network call, so a row that kills the worker every time still
   runs out of attempts and ends ``stuck``.  Rows whose previous attempt never
   recorded an outcome and that have no attempts left are parked as ``stuck``
   here instead of being sent again.  A row still holding the claim of a worker
   that died is claimed alone, so a row that kills its worker does not take
   healthy batch-mates down with it again.

2. Build.  The application's ``build_delivery`` runs for each row.  An
   exception is one failed attempt for that row only (traceback logged,
   message in ``last_error``); its neighbours go on.

3. Send (no transaction open).  Deliveries run in a bounded thread pool
   (``concurrency``).  Each send has a total deadline, the outbox's
   ``timeout`` (connect, write, the whole answer; ``HttpTransport`` enforces
   it), so a receiver that hangs or drips its answer costs one slot for one
   timeout, never the batch, and no database transaction is held across
   network I/O.

4. Record (one short transaction per row, guarded by the claim token).  As
   each send finishes, its outcome is decided by the ``RetryPolicy`` and
   written on its own: one prepared ``UPDATE`` in autocommit mode, so one
   round trip and one transaction per row.  One row's failure never rolls
   back a neighbour, and a row that was reset or claimed again meanwhile is
   not overwritten.  The write stores the latest attempt's status code and
   error (a delivered row keeps no stale error).

*The lease outlasts every send*: a drainer never holds more than
``batch_size`` rows between claim and recorded outcome, summed over all its
drains running at once in the process (``InFlightLimit``), and they share
``concurrency`` send threads, so a claimed row is sent within
``ceil(batch_size / concurrency)`` rounds of sends, each ending by its
deadline.  The lease (``OutboxOptions.minimum_lease``) is that, plus a
margin, so a live delivery is never claimed twice.

Commit durability (``OutboxKitSettings.synchronous_commit``, see
``outboxkit.queries``): by default neither the claim nor the outcome waits
for the WAL flush.  Both are visible to every other session at once and
survive any crash of the drainer; only a crash of the PostgreSQL server
within about 600 ms can forget them, and then the row is due again and sent
again with the same key (an attempt the row does not count), never lost.

Two ways to run it:

* ``drain`` / ``drain_once``: a call that returns.  ``drain`` keeps the pool
  fed (it claims the next rows while the previous ones' slowest sends are
  still out, as soon as no more than ``max(concurrency, batch_size // 2)``
  rows are in flight) and claims until a claim comes back empty, then waits
  for its own sends (each bounded by its deadline) and returns.
  ``drain_once`` is the same with a single claim.
* ``start()``: a background loop per drainer that never waits on one slow
  send to keep claiming other due rows.  It claims whenever it is woken
  (``wake()``: a NOTIFY, a reset) and whenever a row comes due: after an
  empty claim it asks for the earliest ``next_attempt_at`` of the outbox and
  sleeps until then (a timer, not a poll loop), and a retry it records moves
  that time earlier.  It polls anyway every ``poll_seconds`` (the safety
  net for a lost notification).  A database error is logged once and
  retried with backoff.  ``stop()`` stops claiming and records what is in
  flight, each send ending by its deadline.

After a claim that took a row alone because its last worker died
mid-delivery, nothing more is claimed until that row is recorded, so a row
that kills its worker takes no freshly claimed neighbour down with it.

*Nothing is lost*: if the process dies anywhere, the rows it held stay
``pending`` with ``next_attempt_at`` at the end of their lease, so they come
due again and are sent with the same ``Idempotency-Key`` (at-least-once; a
receiver that dedups on the key makes it effectively-once).

``drain_once`` and ``drain`` never raise into their caller and always return
their connections: a database error is logged and reported in the result.
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from outboxkit.attempts import AttemptLog, AttemptRecord
from outboxkit.clock import Clock, SystemClock
from outboxkit.diagnostics import SchemaProblemLog
from outboxkit.errors import DeliveryBuildError, KitClosedError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.pauses import PauseCheck
from outboxkit.policy import AttemptResult, Decision, FailureKind, RetryPolicy
from outboxkit.queries import OutboxQueries, Outcome, queries_for
from outboxkit.send_pool import InFlightLimit, SendPool
from outboxkit.telemetry import Telemetry, log_fields
from outboxkit.transport import Delivery, Transport

__all__ = ["DrainResult", "Drainer", "drain_once"]

logger = logging.getLogger("outboxkit.drain")

# The background loop's timings.  A claim that could not take rows that are
# due (another transaction holds their locks: a concurrent claim for a moment,
# an application transaction for longer), or that this drainer's other drains
# left no in-flight slot for, is retried this soon, doubling while it goes on:
RETRY_CLAIM_SECONDS = 0.05
RETRY_CLAIM_MAX_SECONDS = 5.0
# After a database error the loop waits this long, doubling up to its poll interval.
FIRST_ERROR_BACKOFF_SECONDS = 0.5
# A send that outlives its deadline by more than this is reported: the lease assumes it cannot.
DEADLINE_SLACK_SECONDS = 1.0
# A send's deadline ends this long before its row's lease (a third of the lease margin, at most 5 s),
# to leave time to record the outcome; with less than MINIMUM_SEND_SECONDS of deadline left (or less
# than the timeout, if that is shorter) the row is not sent but retried.
RECORD_MARGIN_SECONDS = 5.0
MINIMUM_SEND_SECONDS = 0.5


@dataclass
class DrainResult:
    """What one drain call did (or, for the background loop, one busy spell)."""

    job_name: str
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    stuck: int = 0
    lost_claims: int = 0  # outcomes not written: the row was reset or re-claimed meanwhile
    error: str | None = None  # a database error that cut the drain short
    schema_problem: bool = False  # that error is a missing table or column, already logged once with the fix
    batches: int = 0
    errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic, repr=False, compare=False)  # monotonic; for telemetry

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def eventful(self) -> bool:
        return bool(self.claimed or self.stuck or self.lost_claims or self.errors)

    def add(self, other: DrainResult) -> None:
        self.claimed += other.claimed
        self.delivered += other.delivered
        self.retried += other.retried
        self.stuck += other.stuck
        self.lost_claims += other.lost_claims
        self.batches += other.batches
        self.errors.extend(other.errors)
        self.error = other.error or self.error

    def as_counts(self) -> dict[str, int]:
        return {
            "claimed": self.claimed,
            "delivered": self.delivered,
            "retried": self.retried,
            "stuck": self.stuck,
            "lost_claims": self.lost_claims,
        }


@dataclass
class _PumpState:
    """What a pump knows between two events; the background loop keeps it across database errors."""

    in_flight: int = 0  # rows handed to the send pool whose outcome is not yet recorded
    more_due: bool = True  # a claim may find rows: nothing said otherwise since the last empty claim
    isolated: bool = False  # the last claim took an orphaned row alone (see the module docstring)
    next_due: datetime | None = None  # the earliest next_attempt_at known (background loop only)
    retry_wait: float = RETRY_CLAIM_SECONDS  # the next wait for due rows that could not be claimed


_WAKE = object()
_STOP = object()


class _CallEvents(queue.SimpleQueue[object]):
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


class _LazyConnection:
    """The outcome connection, checked out on first use (a drain that claims nothing needs none)."""

    def __init__(self, queries: OutboxQueries, engine: Engine, cleanup: contextlib.ExitStack) -> None:
        self._queries = queries
        self._engine = engine
        self._cleanup = cleanup
        self._connection: Connection | None = None

    def get(self) -> Connection:
        if self._connection is None:
            self._connection = self._cleanup.enter_context(self._queries.outcome_connection(self._engine))
        return self._connection


class _Background:
    """The background loop's controls: its thread, its event queue, its stop flag."""

    def __init__(self, job_name: str, poll_seconds: float) -> None:
        self.poll_seconds = poll_seconds
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.result = DrainResult(job_name=job_name)
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

    def wait_seconds(self, state: _PumpState, *, blocked: bool, now: datetime) -> float | None:
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


class Drainer:
    """Drains one outbox class.  Thread-safe; keeps a bounded thread pool for sends.

    Build one per outbox and reuse it (the kit does); call ``close()`` when done.
    ``drain()`` and ``drain_once()`` are calls that return; ``start()`` runs
    the background loop that claims on ``wake()`` and at due times.
    """

    def __init__(
        self,
        engine: Engine,
        outbox: type[Outbox],
        *,
        transport: Transport,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        options: OutboxOptions | None = None,
        synchronous_commit: bool = False,
        telemetry: Telemetry | None = None,
        attempt_history_days: float = 7.0,
    ) -> None:
        self.engine = engine
        self.outbox = outbox
        self.options = options or outbox.__outbox__
        self.policy = policy or RetryPolicy(backoff=self.options.backoff, max_attempts=self.options.max_attempts)
        self.transport = self.options.sending_transport(transport)  # signed when the outbox signs (webhook_signing)
        self.clock = clock or SystemClock()
        self.queries: OutboxQueries = queries_for(outbox, synchronous_commit=synchronous_commit)
        self._senders = SendPool(self.options.concurrency, name=f"outboxkit-send-{self.options.job_name}")
        self._in_flight = InFlightLimit(self.options.batch_size)
        self._refill_at = _refill_threshold(self.options.batch_size, self.options.concurrency)
        self._lock = threading.Lock()
        self._background: _Background | None = None
        self._closed = False
        self._overrun_reported = False
        self._record_margin = min(RECORD_MARGIN_SECONDS, self.options.lease_margin / 3)
        self._schema_problems = SchemaProblemLog(logger)
        self.telemetry = telemetry if telemetry is not None else Telemetry()  # hooks; no-ops unless attached
        # Attempt history (outboxkit.attempts) and the operator's pause (outboxkit.pauses).
        self.attempt_log = AttemptLog(self.job_name, keep_days=attempt_history_days, table=self.queries.table_name)
        self.pause_check = PauseCheck(engine, self.job_name)

    @property
    def job_name(self) -> str:
        return self.options.job_name

    @property
    def in_flight(self) -> int:
        """Rows this drainer holds now, between claim and recorded outcome (all its drains together)."""
        return self._in_flight.held

    def close(self) -> None:
        """Stop the background loop, wait for sends in flight, then release the thread pool."""
        self.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._senders.shutdown()

    # -- calls that return ---------------------------------------------------

    def drain_once(self) -> DrainResult:
        """Claim, deliver and record one batch.  Never raises."""
        return self._run(max_claims=1, deadline=None, stop=None)

    def drain(
        self, *, max_batches: int | None = None, max_seconds: float | None = None, stop: threading.Event | None = None
    ) -> DrainResult:
        """Drain until no due row is left (or a limit or ``stop`` is reached).  Never raises.

        Claims overlap with sends (see the module docstring), so the send
        pool stays busy from one batch to the next.  ``max_batches`` caps the
        number of claims; ``max_seconds`` and ``stop`` stop new claims, and the
        rows already claimed are still delivered and recorded (each send ends
        by its deadline) before it returns.
        """
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        return self._run(max_claims=max_batches, deadline=deadline, stop=stop)

    def _run(self, *, max_claims: int | None, deadline: float | None, stop: threading.Event | None) -> DrainResult:
        result = DrainResult(job_name=self.job_name)
        state = _PumpState()
        events = _CallEvents(self._in_flight)

        def may_claim() -> bool:
            if max_claims is not None and result.batches >= max_claims:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            return not (stop is not None and stop.is_set())

        try:
            self._pump(result, state, events, may_claim=may_claim, background=None)
        except Exception as exc:  # a database outage must not escape into a scheduler
            described = self._schema_problems.report(exc, self.outbox)  # a missing table: said once, with the fix
            result.error = described or f"{type(exc).__name__}: {exc}"
            result.schema_problem = described is not None
            if described is None:
                logger.error("%s: drain failed: %s", self.job_name, result.error,
                             extra=log_fields("drain.failed", self.job_name))
            self._settle(state, events)
        self._report(result)
        self.telemetry.drain_finished(self.job_name, result, loop=False)
        return result

    def _settle(self, state: _PumpState, events: _CallEvents) -> None:
        """After an error: return at once, leaving this call's sends still out to finish on their own.

        Their outcomes are not written: each row keeps its lease and comes
        due again when it ends, a redelivery with the same key, never a loss.
        Each frees its in-flight slot as it finishes (by its deadline), so
        the bound on rows held stays true without this call waiting.
        """
        events.abandon()
        state.in_flight = 0

    # -- the background loop -----------------------------------------------

    def start(self, *, poll_seconds: float = 60.0) -> None:
        """Run the background loop in a daemon thread (idempotent).  It claims at once.

        ``poll_seconds`` bounds how long it sleeps without being woken or a
        row coming due (the safety net for a lost notification).
        """
        with self._lock:
            previous = self._background
        if previous is not None:
            if not previous.stopping.is_set():
                return
            self.stop()  # a loop still finishing its last rows: let it end first
        with self._lock:
            if self._closed:
                raise KitClosedError("this drainer is closed")
            if self._background is not None:
                return
            background = _Background(self.job_name, poll_seconds)
            background.thread = threading.Thread(
                target=self._serve, args=(background,), name=f"outboxkit-drain-{self.job_name}", daemon=True
            )
            self._background = background
        background.thread.start()

    @property
    def running(self) -> bool:
        """True while the background loop runs (or is finishing its rows in flight)."""
        return self._background is not None

    def wake(self) -> None:
        """Tell the background loop rows may be due now (a NOTIFY, a reset).  Cheap; coalesces."""
        background = self._background
        if background is not None:
            self.pause_check.forget()  # the wake-up may be a resume
            background.wake()

    def stop(self, timeout: float | None = None, *, wait: bool = True) -> None:
        """Stop the background loop: no new claims; rows in flight are sent and recorded first.

        ``wait=False`` only asks it to stop (to stop several loops at once);
        a later ``stop()`` waits for it.
        """
        with self._lock:
            background = self._background
        if background is None:
            return
        background.stop()
        if not wait:
            return
        if background.thread is not None and background.thread is not threading.current_thread():
            background.thread.join(timeout)
            if background.thread.is_alive():
                return  # still finishing within its deadline; a later stop() waits again
        with self._lock:
            if self._background is background:
                self._background = None

    def _serve(self, background: _Background) -> None:
        state = _PumpState()
        backoff = FIRST_ERROR_BACKOFF_SECONDS
        while not background.stopping.is_set() or state.in_flight:
            try:
                self._pump(
                    background.result,
                    state,
                    background.events,
                    may_claim=lambda: not background.stopping.is_set(),
                    background=background,
                )
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                # A missing table is said once, with the migration to run, by the schema log itself.
                schema_problem = self._schema_problems.report(exc, self.outbox) is not None
                if schema_problem:
                    logger.debug("%s: drain still failing on the schema: %s", self.job_name, message)
                elif message != background.failing:
                    background.failing = message
                    logger.error("%s: drain failed: %s; retrying", self.job_name, message,
                                 extra=log_fields("drain.failed", self.job_name))
                else:
                    logger.debug("%s: drain still failing: %s", self.job_name, message)
                background.result.errors.append(message)
                self._report(background.result)
                self.telemetry.drain_finished(self.job_name, background.result, loop=True)
                background.result = DrainResult(job_name=self.job_name)
                state.more_due = True
                if background.stopping.wait(backoff) and not state.in_flight:
                    break
                backoff = min(backoff * 2, background.poll_seconds)
            else:
                backoff = FIRST_ERROR_BACKOFF_SECONDS
        self._report(background.result)

    # -- the pump ------------------------------------------------------------

    def _pump(
        self,
        result: DrainResult,
        state: _PumpState,
        events: queue.SimpleQueue[object],
        *,
        may_claim: Callable[[], bool],
        background: _Background | None,
    ) -> None:
        """Claim, send and record until there is nothing left to do; see the module docstring.

        A call (``background=None``) returns once no claim is due and its
        own sends are recorded.  The background loop waits instead, for an
        outcome, a wake-up or the next due time, and returns only once it is
        stopping with nothing in flight.
        """
        with contextlib.ExitStack() as cleanup:
            outcomes = _LazyConnection(self.queries, self.engine, cleanup)
            while True:
                may_refill = state.in_flight <= self._refill_at and not (state.isolated and state.in_flight)
                blocked = False
                if state.more_due and may_refill and may_claim():
                    granted = self._in_flight.take(self.options.batch_size - state.in_flight)
                    if granted:
                        self._claim_and_send(granted, state, events, outcomes, result, background)
                        continue
                    blocked = True  # this drainer's other drains hold every in-flight slot
                if self.attempt_log.due(idle=not state.in_flight):
                    self._flush_attempts(outcomes)
                if background is None:
                    if not state.in_flight:
                        return
                    timeout = None
                else:
                    if background.stopping.is_set() and not state.in_flight:
                        return
                    if not state.in_flight and not state.more_due and result.eventful:
                        self._report(result)  # the end of a busy spell: one summary line
                        self.telemetry.drain_finished(self.job_name, result, loop=True)
                        background.result = result = DrainResult(job_name=self.job_name)
                    timeout = background.wait_seconds(state, blocked=blocked, now=self.clock.now())
                try:
                    event = events.get(timeout=timeout)
                except queue.Empty:
                    state.more_due = True  # a row came due (or the safety-net poll)
                    continue
                if event is _WAKE:
                    assert background is not None
                    background.woken()
                    state.more_due = True
                    continue
                if event is _STOP:
                    continue
                row, token, attempt, started_at = typing.cast("tuple[Outbox, uuid.UUID, AttemptResult, datetime]", event)
                state.in_flight -= 1
                self._in_flight.give(1)
                decision = self._record(outcomes.get(), row, token, attempt, result, started_at=started_at)
                if decision is not None and decision.status == "pending" and decision.next_attempt_at is not None:
                    if state.next_due is None or decision.next_attempt_at < state.next_due:
                        state.next_due = decision.next_attempt_at

    def _claim_and_send(
        self,
        granted: int,
        state: _PumpState,
        events: queue.SimpleQueue[object],
        outcomes: _LazyConnection,
        result: DrainResult,
        background: _Background | None,
    ) -> None:
        try:
            rows, token, taken, orphaned = self._claim(granted, result)
        except BaseException:
            self._in_flight.give(granted)
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
        self._in_flight.give(granted - len(deliveries))
        timeout = self.options.timeout
        for row, delivery in deliveries:
            key = str(row.idempotency_key)
            self._senders.submit(self._send_one, events, row, token, delivery, key, timeout)
            state.in_flight += 1
        for row, failure in build_failures:
            self._record(outcomes.get(), row, token, failure, result)
        if not state.more_due and background is not None:
            state.next_due = self._earliest_due()

    def _earliest_due(self) -> datetime | None:
        with self.engine.connect() as connection:
            return self.queries.earliest_due(connection)

    def _claim(self, wanted: int, result: DrainResult) -> tuple[list[Outbox], uuid.UUID, int, bool]:
        """One short committed transaction: take up to ``wanted`` due rows.

        Returns (rows to send, token, rows taken, whether the claim took an orphaned row alone).
        """
        token = uuid.uuid4()
        if self.pause_check.paused():
            return [], token, 0, False  # an operator paused this outbox: claim nothing, in every process
        if not result.claimed:
            result.started = time.monotonic()  # a loop's busy spell starts at the claim that finds rows
        with Session(self.engine, expire_on_commit=False, autoflush=False) as session, session.begin():
            now = self.clock.now()
            lease_until = now + timedelta(seconds=self.options.lease_seconds)
            rows, orphaned = self.queries.claim_due_rows(
                session, now=now, lease_until=lease_until, limit=wanted, token=token
            )
            taken = len(rows)
            rows = self._park_exhausted(session, rows, token=token, now=now, result=result)
        result.batches += 1
        result.claimed += len(rows)  # parked rows are counted as stuck, not as claimed
        return rows, token, taken, orphaned

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
            finished.put((row, token, attempt, started_at))
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

    def _park_exhausted(
        self, session: Session, rows: list[Outbox], *, token: uuid.UUID, now: datetime, result: DrainResult
    ) -> list[Outbox]:
        exhausted = [row for row in rows if row.attempts > self.policy.max_attempts]
        if not exhausted:
            return rows
        message = (
            f"max attempts ({self.policy.max_attempts}) reached; the last attempt recorded no outcome "
            "(the worker stopped or lost its lease during the delivery)"
        )
        self.queries.park_exhausted(session, ids=[row.id for row in exhausted], token=token, now=now, error=message)
        result.stuck += len(exhausted)
        self.telemetry.parked(self.job_name, exhausted)
        logger.warning("%s: parked %d row(s) as stuck: %s", self.job_name, len(exhausted), message,
                       extra=log_fields("drain.parked", self.job_name, rows=len(exhausted)))
        parked = {row.id for row in exhausted}
        return [row for row in rows if row.id not in parked]

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

    def _record(
        self,
        connection: Connection,
        row: Outbox,
        token: uuid.UUID,
        attempt: AttemptResult,
        result: DrainResult,
        *,
        started_at: datetime | None = None,
    ) -> Decision | None:
        """Write one outcome; returns the decision, or None if nothing was written."""
        now = self.clock.now()
        decision = self.policy.decide(attempt, attempts=row.attempts, now=now)
        error = None if attempt.succeeded else (attempt.error or decision.reason)
        if decision.status == "stuck" and error and decision.reason not in error:
            error = f"{error} ({decision.reason})"
        outcome = Outcome(
            row_id=row.id,
            token=token,
            status=decision.status,
            next_attempt_at=decision.next_attempt_at,
            status_code=attempt.status_code,
            error=error,
        )
        try:
            written = self.queries.record_outcome(connection, outcome, now=now)
        except Exception as exc:
            # The row keeps its lease and comes due again when it ends: a
            # redelivery with the same key, never a loss.
            result.errors.append(f"row {row.id}: {type(exc).__name__}: {exc}")
            logger.error("%s: could not record the outcome of row %s: %s", self.job_name, row.id, exc,
                         extra=log_fields("drain.record_failed", self.job_name, row))
            driver = connection.connection.driver_connection
            if driver is None or driver.broken or driver.closed:
                connection.invalidate()  # the pool must not hand this connection out again
                raise
            return None
        self.attempt_log.add(
            AttemptRecord(
                row_id=row.id,
                attempt=row.attempts,
                started_at=started_at or now,
                finished_at=now,
                outcome=("retry" if decision.status == "pending" else decision.status) if written else "lost",
                status_code=attempt.status_code,
                error=error,
            )
        )
        if not written:
            result.lost_claims += 1
            self.telemetry.recorded(self.job_name, row, attempt, "lost_claim", now)
            logger.warning("%s: row %s was reset or claimed again during its delivery; outcome dropped", self.job_name, row.id,
                           extra=log_fields("drain.lost_claim", self.job_name, row))
            return None
        if decision.status == "done":
            result.delivered += 1
        elif decision.status == "stuck":
            result.stuck += 1
            fields = log_fields("drain.row_stuck", self.job_name, row, status="stuck", status_code=attempt.status_code)
            logger.warning("%s: row %s is stuck: %s", self.job_name, row.id, error, extra=fields)
        else:
            result.retried += 1
        self.telemetry.recorded(self.job_name, row, attempt, decision.status, now)
        return decision

    def _flush_attempts(self, outcomes: _LazyConnection) -> None:
        """Write the attempt history (outboxkit.attempts) on the outcome connection, which holds it.

        The minute's upkeep alone (nothing buffered) takes a short-lived
        connection instead, so an idle loop holds no pool slot.
        """
        if self.attempt_log.pending:
            self.attempt_log.flush(outcomes.get(), now=self.clock.now())
            return
        with self.queries.outcome_connection(self.engine) as connection:
            self.attempt_log.flush(connection, now=self.clock.now())

    def _report(self, result: DrainResult) -> None:
        if result.claimed or result.stuck:
            logger.info(
                "%s: claimed %d, delivered %d, retried %d, stuck %d%s",
                self.job_name,
                result.claimed,
                result.delivered,
                result.retried,
                result.stuck,
                f", lost claims {result.lost_claims}" if result.lost_claims else "",
                extra=log_fields("drain.summary", self.job_name, None, **result.as_counts()),
            )


def _refill_threshold(batch_size: int, concurrency: int) -> int:
    """Claim again once this few rows are left in flight.

    At least ``concurrency``, so every send thread still has a row while the
    next claim is made, and at least half a batch, so a few rows wait queued
    behind the busy threads: a claim (a round trip, a commit, ORM loading,
    and the GIL shared with the send threads) can take long enough that
    threads finishing meanwhile would otherwise sit idle.  Against
    a 50 ms receiver, refilling at 25 instead of 16 rows kept 14.6-15.0 of 16
    threads busy on average instead of 12.9-14.7, at the cost of smaller
    claims.  Rows in flight never exceed ``batch_size``, so each row is still
    sent within the rounds its lease allows.
    """
    if concurrency >= batch_size:
        return batch_size // 2  # the pool cannot be kept full; claim at half a batch
    return max(concurrency, batch_size // 2)


def drain_once(
    engine: Engine,
    outbox: type[Outbox],
    *,
    transport: Transport | None = None,
    clock: Clock | None = None,
    policy: RetryPolicy | None = None,
    synchronous_commit: bool = False,
) -> DrainResult:
    """Drain one batch of ``outbox`` with a throwaway ``Drainer``.  Never raises.

    Applications normally call ``OutboxKit.drain_once``, which reuses its
    drainers and their thread pools; this function suits scripts and tests.
    """
    owned_transport = transport is None
    if transport is None:
        from outboxkit.http_transport import HttpTransport

        transport = outbox.__outbox__.transport or HttpTransport()
        owned_transport = outbox.__outbox__.transport is None
    drainer = Drainer(
        engine, outbox, transport=transport, clock=clock, policy=policy, synchronous_commit=synchronous_commit
    )
    try:
        return drainer.drain_once()
    finally:
        drainer.close()
        if owned_transport:
            transport.close()
