"""Steps 2 and 3 of the drain, and the pump that keeps them fed: build, send, hand each outcome back.

2. Build.  The application's ``build_delivery`` runs for each row.  An
   exception is one failed attempt for that row only (traceback logged,
   message in ``last_error``); its neighbours go on.

   The claim took no row of a blocked destination (open, disabled, slowed)
   and no more rows of a suspect one than its cap
   or rate-limit tokens (``outboxkit.storage.destination_claim``).

3. Send (no transaction open).  Deliveries run in a bounded thread pool
   (``concurrency``).  Each send has a total deadline, the outbox's
   ``timeout`` (connect, write, the whole answer; ``HttpTransport`` enforces
   it), so a receiver that hangs or drips its answer costs one slot for one
   timeout, never the batch, and no database transaction is held across
   network I/O.  The deadline is also cut to what is left of the row's lease
   (less the time to record the outcome), so a drainer that was paused or
   starved after its claim never sends past its lease.

The pump claims (``outboxkit.drain.claim``), hands the rows to the send pool
and records the outcomes as they come back (``outboxkit.drain.record``), on
the one thread that runs it: those that come back close together are
gathered into one group and written in one transaction (``gather_group``,
bounded by ``OutcomeGrouping``; no wait when no other send is out).  It
keeps the pool fed: it claims the next rows
while the previous ones' slowest sends are still out, once no more rows are
in flight than the refill threshold (``drain_loop.refill_threshold``).  After a claim
that took a row alone because its last worker died mid-delivery, nothing more
is claimed until that row is recorded, so a row that kills its worker takes
no freshly claimed neighbour down with it.  The background loop's pump waits
for an outcome, a wake-up or the earliest due time it knows of (``drain_loop.Background``).

The pump's loop, its claim-and-send step and the read a claim leaves for
later share one state (``PumpState``), one outcome connection, the send pool
and the in-flight bound, so they live together; the steps below it (claim,
record, gate) live in their own modules.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Generic

from sqlalchemy import Connection, Engine

from outboxkit.breaker import check_destination_name
from outboxkit.destinations.gate import DestinationGate, Send
from outboxkit.drain.claim import Claimer
from outboxkit.drain.hung_sends import HungSends
from outboxkit.drain.loop import RETRY_CLAIM_SECONDS, WAKE, Background, PumpState, ResultT, refill_threshold
from outboxkit.drain.record import FinishedSend, OutcomeConnection, OutcomeGrouping, Recorder
from outboxkit.drain.send_pool import InFlightLimit, SendPool
from outboxkit.errors import DeliveryBuildError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.diagnostics import SchemaProblemLog
from outboxkit.storage.drain_queries import OutboxQueries
from outboxkit.storage.wakeups import RECHECK_SECONDS, Wakeups
from outboxkit.telemetry.hooks import Telemetry, log_fields, outcome_name
from outboxkit.transports.base import Delivery, Transport

__all__ = ["SendPump", "gather_group"]

logger = logging.getLogger(__name__)

# A send that outlives its deadline by more than this is reported: the lease assumes it cannot.
DEADLINE_SLACK_SECONDS = 1.0
# A send's deadline ends this long before its row's lease (a third of the lease margin, at most 5 s),
# to leave time to record the outcome; with less than MINIMUM_SEND_SECONDS of deadline left (or less
# than the timeout, if that is shorter) the row is not sent but retried.
RECORD_MARGIN_SECONDS = 5.0
MINIMUM_SEND_SECONDS = 0.5



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
        clock: DatabaseTime,
        telemetry: Telemetry,
        claimer: Claimer,
        recorder: Recorder,
        gate: DestinationGate,
        schema_problems: SchemaProblemLog,
        end_spell: Callable[[ResultT], ResultT],
        grouping: OutcomeGrouping | None = None,
        wakeups: Wakeups | None = None,
    ) -> None:
        self.engine = engine
        self.queries = queries
        self.options = options
        self.transport = transport
        self.clock = clock
        self.telemetry = telemetry
        self.claimer = claimer
        self.recorder = recorder
        self.gate = gate
        self._schema_problems = schema_problems
        self._end_spell = end_spell
        self.grouping = grouping or OutcomeGrouping()
        self.wakeups = wakeups  # the outbox's pending wake-up, cleared by the background loop
        self.senders = SendPool(self.options.concurrency, name=f"outboxkit-send-{self.options.job_name}",
                                max_extra=self.options.hung_sends_allowed)
        self.in_flight = InFlightLimit(self.options.batch_size)
        # Sends out past their threshold stop counting against concurrency (outboxkit.drain.hung_sends): the pool runs
        # that many threads beyond its size, and their in-flight places are given back.
        self.hung = HungSends(
            after=self.options.hung_send_seconds, limit=self.options.hung_sends_allowed, on_change=self.senders.allow_extra
        )
        self._refill_at = refill_threshold(self.options.batch_size, self.options.concurrency)
        self._overrun_reported = False
        self._record_margin = min(RECORD_MARGIN_SECONDS, self.options.lease_margin / 3)
        self._ordered = queries.ordered is not None  # the class's ordering key, which its claim and indexes follow

    @property
    def job_name(self) -> str:
        return self.options.job_name

    def new_state(self) -> PumpState:
        """A fresh state for a drain call or the background loop."""
        return PumpState()

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
                if state.due_read is not None and not state.in_flight:
                    self._read_due(state, outcomes)
                if state.hung_check_in(self.hung) == 0.0:
                    self._mark_hung(state, events)
                counted = state.in_flight - state.hung  # hung sends no longer count (outboxkit.drain.hung_sends)
                may_refill = counted <= self._refill_at and not (state.isolated and state.in_flight)
                blocked = False
                if state.more_due and may_refill and may_claim():
                    granted = self.in_flight.take(self.options.batch_size - counted)
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
                hung_check = state.hung_check_in(self.hung)
                if hung_check is not None:
                    if timeout is not None and hung_check >= timeout:
                        hung_check = None
                    else:
                        timeout = hung_check
                try:
                    event = events.get(timeout=timeout)
                except queue.Empty:
                    if hung_check is not None:  # a send may be hung now: looked at on the next turn
                        continue
                    if state.due_read is not None:  # the claim's sends have started: its read is due
                        self._read_due(state, outcomes)
                    else:
                        state.more_due = True  # a row came due (or the safety-net poll)
                    continue
                if not isinstance(event, FinishedSend):
                    self._control(event, state, background, result)
                    continue
                group, control = gather_group(
                    event, events, in_flight=max(1, state.in_flight - state.hung), grouping=self.grouping
                )
                self._control(control, state, background, result)  # before the write, which may raise: never lost
                hung = sum(1 for finished in group if finished.hung)  # their places were given back when they hung
                state.in_flight -= len(group)
                state.hung -= hung
                self.in_flight.give(len(group) - hung)
                if state.awaiting_outcome:  # a place under a capped destination's limit is free again
                    state.awaiting_outcome, state.more_due = False, True
                self._record(group, state, outcomes, result)
                if state.due_read is not None:  # a send is back: the claim's read no longer runs beside it
                    self._read_due(state, outcomes)
                if self.gate.take_unblocked():  # a probe succeeded: its destination's rows may be claimed now
                    state.more_due = True

    def _mark_hung(self, state: PumpState, events: queue.SimpleQueue[object]) -> None:
        """Sends of this pump out past their threshold stop counting against concurrency: their in-flight places
        are given back (the pool already lets as many threads beyond its size run), so the pump claims more."""
        now = time.monotonic()
        marked = self.hung.mark_overdue(events, now=now)
        # Looked at again when the next send out now passes its threshold, or the shortest threshold from now at
        # the latest: a send that starts later cannot pass its own before that.
        state.hung_check_at = now + (self.hung.next_check(events, now=now) or 0.0)
        if marked:
            state.hung += marked
            self.in_flight.give(marked)

    def _control(
        self, event: object, state: PumpState, background: Background[ResultT] | None, result: ResultT
    ) -> None:
        """Act on an event that is not an outcome: a wake-up (rows may be due), or a stop (nothing to do: the loop
        sees its flag)."""
        if event is WAKE:
            assert background is not None
            background.woken()
            state.more_due = True

    def _record(
        self, group: list[FinishedSend], state: PumpState, outcomes: OutcomeConnection, result: ResultT
    ) -> None:
        """Write a group's outcomes; a retry it records moves the loop's next due time earlier."""
        for decision in self.recorder.record_group(outcomes.get(), group, result):
            if decision.status == "done" and self._ordered:
                state.more_due = True  # the next row of its key is its head now, and may be due
            if decision.status == "pending" and decision.next_attempt_at is not None:
                if state.next_due is None or decision.next_attempt_at < state.next_due:
                    state.next_due = decision.next_attempt_at

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
        # The one guard of the places this claim took: until they are handed to sends, any error (the claim, a
        # killed session, a build that raises) gives every one back, so the drainer keeps claiming; the rows a
        # failed step held come due again at their lease's end.
        try:
            cleared: bool | None = None  # the pending wake-up, cleared before a loop's claim once it caught up
            if background is not None and state.clear_first and self.wakeups is not None:
                cleared = outcomes.run_reconnecting(self.wakeups.clear)
            # A held connection that died while the loop was idle is replaced and the claim made once more:
            # nothing was sent, and rows a lost claim took come due at its lease's end.
            rows, token, taken, orphaned = outcomes.run_reconnecting(
                lambda connection: self.claimer.claim(
                    granted, result, may_claim, connection, due_read_follows=background is not None
                )
            )
            deliveries, build_failures = self._build(rows)
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
        short = 0 < taken < granted and not orphaned
        if background is not None and self.wakeups is not None:
            short = self._follow_wakeup(state, cleared, caught_up=short or not state.more_due) and short
        state.awaiting_outcome = taken == 0 and state.in_flight > 0
        self.in_flight.give(granted - len(deliveries))
        submit = self._sender(state, events, result)
        for row, delivery, destination in deliveries:
            submit(Send(row, delivery, destination), token)
        if build_failures:
            failed = [FinishedSend(row, token, failure) for row, failure in build_failures]
            self._record(failed, state, outcomes, result)
        if background is not None and (short or not state.more_due):
            # The loop's next wake-up.  A short claim took every row it could lock: when none is due
            # now, this read stands in for the empty claim that would have said so (one round trip
            # instead of a claim's transaction); when some are (locked elsewhere, or just come due),
            # the loop claims again as after any claim that found rows.  With sends out, the read waits
            # for the first outcome, at most DUE_READ_DELAY_SECONDS: run beside them it delayed their
            # start (the send thread waited for a CPU and the GIL) on the idle-latency path
            # (docs/performance.md).
            state.more_due = False
            state.due_read = "short" if short else "empty"
            if not state.in_flight:
                self._read_due(state, outcomes)

    @staticmethod
    def _follow_wakeup(state: PumpState, cleared: bool | None, *, caught_up: bool) -> bool:
        """After a loop's claim: what the pending wake-up (``outboxkit.storage.wakeups``) asks of the loop.

        A loop that caught up without clearing it claims once more, clearing it first: an insert meanwhile may
        have relied on it rather than notify.  False when that extra claim is due (the claim's due read waits).
        """
        state.wakeup_held = cleared is False
        if cleared:
            state.recheck_wait = RECHECK_SECONDS
        if caught_up and cleared is None:
            state.clear_first = state.more_due = True
            return False
        state.clear_first = caught_up
        return True

    def _sender(
        self, state: PumpState, events: queue.SimpleQueue[object], result: ResultT
    ) -> Callable[[Send, uuid.UUID], None]:
        """Hands a cleared row to the send pool and counts it in flight in ``state``."""

        def submit(send: Send, token: uuid.UUID) -> None:
            key = str(send.row.idempotency_key)
            self.senders.submit(
                self._send_one, events, send.row, token, send.delivery, key, self.options.timeout, send.destination,
                result.telemetry_links,
            )
            state.in_flight += 1

        return submit

    def _read_due(self, state: PumpState, outcomes: OutcomeConnection) -> None:
        """The read a claim left to do (``PumpState.due_read``): the next due time, and for a short claim whether
        rows are due now (it only adds: a wake-up meanwhile already said so)."""
        short = state.due_read == "short"
        state.due_read = None
        state.next_due = self._earliest_due(outcomes)
        if short and state.next_due is not None and state.next_due <= self.clock.now():
            state.more_due = True

    def _earliest_due(self, outcomes: OutcomeConnection) -> datetime | None:
        """One statement in AUTOCOMMIT (no BEGIN, no ROLLBACK), on the outcome connection when the loop holds it.

        It follows a claim, so a held connection that died meanwhile (a server restart between the claim and this
        read) is replaced and the read made once more, as the claim does: a read is safe to repeat."""
        if outcomes.held is not None:
            return outcomes.run_reconnecting(self._earliest_due_on)
        with self.queries.outcome_connection(self.engine) as connection:
            return self._earliest_due_on(connection)

    def _earliest_due_on(self, connection: Connection) -> datetime | None:
        self.clock.refresh(connection)  # the loop's sleep is counted by the server's time (storage.database_time)
        return self.queries.earliest_due(
            connection, now=self.clock.parameter(), rate_limit=self.options.rate_limit, cursor=self.claimer.walk_cursor
        )

    def _send_one(
        self,
        finished: queue.SimpleQueue[object],
        row: Outbox,
        token: uuid.UUID,
        delivery: Delivery,
        key: str,
        timeout: float,
        destination: str,
        run_links: dict[int, list[Any]],
    ) -> None:
        """Runs in the send pool: one delivery, its result handed back to the recording thread.

        The send's deadline is also cut to what is left of the row's lease
        (less the time to record the outcome), so even a drainer that was
        paused or starved after its claim never sends past its lease; a row
        whose lease is nearly over is not sent at all and is retried.
        """
        started_at = self.clock.now()
        attempt = None
        started = time.monotonic()
        send_key = (row.id, token)
        self.hung.started(send_key, owner=finished, destination=destination, now=started)
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
            elapsed = time.monotonic() - started
            answered = attempt.answered  # how long the receiver or broker took is its answer time
            hung = self.hung.finished(send_key, answered_in=elapsed if answered else None)
            outcome = outcome_name(self.recorder.policy.status_for(attempt, attempts=row.attempts))
            probe.sent(attempt, outcome=outcome, run_links=run_links)  # run_links: the drain span links its attempts
            finished.put(FinishedSend(row, token, attempt, started_at, destination, hung=hung))
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

    def _build(
        self, rows: list[Outbox]
    ) -> tuple[list[tuple[Outbox, Delivery, str]], list[tuple[Outbox, AttemptResult]]]:
        """Each row's delivery and destination; an exception in either is that row's failed attempt."""
        deliveries: list[tuple[Outbox, Delivery, str]] = []
        failures: list[tuple[Outbox, AttemptResult]] = []
        for row in rows:
            try:
                delivery = row.build_delivery()
                if not isinstance(delivery, Delivery):
                    raise DeliveryBuildError(
                        f"{type(row).__name__}.build_delivery returned {type(delivery).__name__}, not Delivery"
                    )
                # Decided at insert; a row whose insert could not decide it (or older than the column) decides now.
                destination = row.destination or check_destination_name(row.destination_for(delivery))
            except Exception as exc:
                logger.error(
                    "%s: build_delivery failed for row %s\n%s", self.job_name, row.id, traceback.format_exc().rstrip(),
                    extra=log_fields("drain.build_failed", self.job_name, row),
                )
                error = f"build_delivery raised {type(exc).__name__}: {exc}"
                failures.append((row, AttemptResult(failure=FailureKind.BUILD, error=error)))
            else:
                deliveries.append((row, delivery, destination))
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
