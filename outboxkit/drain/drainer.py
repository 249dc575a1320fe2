"""The drain: claim due rows, deliver them, record each outcome.

A drain works in four steps, each in its own module with the prose of the
invariant it protects; the ``Drainer`` here composes them (``Claimer``,
``SendPump``, ``Recorder``) and drives them with calls and a background loop:

1. Claim (``outboxkit.drain.claim``, one statement, its own transaction).  Due rows are
   taken with ``FOR UPDATE SKIP LOCKED``, leased, and their attempt counted
   and committed.  *Disjoint claims*: two drains, in one process or two,
   never get the same row while its lease runs.  *Claim before send*: a row
   that kills the worker every time still runs out of attempts and ends
   ``stuck``.

2. Build and 3. Send (``outboxkit.drain.pump``, no transaction open).  A
   failing ``build_delivery`` is one failed attempt for that row only; sends
   run in a bounded thread pool, each with a total deadline, so a slow
   receiver costs one slot for one timeout, never the batch.

4. Record (``outboxkit.drain.record``).  Outcomes that finish close
   together are written in one short transaction (at most 50 rows, waiting
   at most 2 ms for others to join, and not at all when nothing else is in
   flight: ``OutcomeGrouping``), each row guarded by its claim token: a row
   that was reset or claimed again meanwhile is not overwritten.  One row's
   failing write never rolls back a neighbour: a failed group is written
   again row by row.

*The lease outlasts every send*: a drainer never holds more than
``batch_size`` rows between claim and recorded outcome, summed over all its
drains running at once in the process (``InFlightLimit``), and they share
``concurrency`` send threads, so a claimed row is sent within
``ceil(batch_size / concurrency)`` rounds of sends, each ending by its
deadline.  The lease (``OutboxOptions.minimum_lease``) is that, plus a
margin, so a live delivery is never claimed twice.

Commit durability (``OutboxKitSettings.synchronous_commit``, see
``outboxkit.storage.drain_queries``): by default the claim and the outcomes wait for the
WAL flush (one flush per claim and one per group of outcomes), so a crash
of the PostgreSQL server forgets neither and ``attempts`` counts every send.  Turned off, neither waits: both are still
visible to every other session at once and survive any crash of the
drainer, but a server crash within about 600 ms can forget them, and then
the row is due again and sent again with the same key (an attempt the row
does not count), never lost.

Two ways to run it:

* ``drain`` / ``drain_once``: a call that returns.  ``drain`` keeps the pool
  fed (it claims the next rows while the previous ones' slowest sends are
  still out, as soon as no more rows are in flight than the refill
  threshold: ``max(concurrency, batch_size // 2)``, but ``batch_size // 2``
  when ``concurrency >= batch_size``) and claims until a claim comes back
  empty, then waits for its own sends (each bounded by its deadline) and
  returns.  ``drain_once`` is the same with a single claim.
* ``start()``: a background loop per drainer that never waits on one slow
  send to keep claiming other due rows.  It claims whenever it is woken
  (``wake()``: a NOTIFY, a reset) and whenever a row comes due: after an
  empty claim it asks for the earliest ``next_attempt_at`` of the outbox and
  sleeps until then (a timer, not a poll loop), and a retry it records moves
  that time earlier.  Before it waits, a loop that caught up clears its
  outbox's pending wake-up and claims once more (``outboxkit.storage.wakeups``):
  an insert meanwhile may have relied on it rather than notify; while such an
  insert's transaction is still open, it claims again within 50 ms.  It polls
  anyway every ``poll_seconds`` (the safety net for a lost notification).  A database error is logged once and
  retried with backoff.  ``stop()`` stops claiming and records what is in
  flight, each send ending by its deadline.

*Nothing is lost*: if the process dies anywhere, the rows it held stay
``pending`` with ``next_attempt_at`` at the end of their lease, so they come
due again and are sent with the same ``Idempotency-Key`` (at-least-once; a
receiver that dedups on the key makes it effectively-once).

``drain_once`` and ``drain`` never raise into their caller and always return
their connections: a database error is logged and reported in the result.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Engine

from outboxkit.clock import Clock, SystemClock
from outboxkit.destinations.gate import DestinationGate
from outboxkit.drain.claim import Claimer
from outboxkit.drain.loop import Background, CallEvents, PumpState
from outboxkit.drain.pump import SendPump
from outboxkit.drain.record import OutcomeGrouping, Recorder
from outboxkit.errors import ConfigurationError, KitClosedError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import RetryPolicy
from outboxkit.results import DrainResult
from outboxkit.storage.attempts import AttemptLog
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.diagnostics import SchemaProblemLog
from outboxkit.storage.drain_queries import OutboxQueries, queries_for
from outboxkit.storage.notify import channel_for
from outboxkit.storage.pauses import PauseCheck
from outboxkit.storage.wakeups import Wakeups
from outboxkit.telemetry.hooks import Telemetry, log_fields
from outboxkit.transports.base import Transport
from outboxkit.transports.guarded import GuardedTransport
from outboxkit.url_guard import UrlGuard

__all__ = ["DrainResult", "Drainer", "drain_once"]

logger = logging.getLogger(__name__)

# After a database error the loop waits this long, doubling up to its poll interval.
FIRST_ERROR_BACKOFF_SECONDS = 0.5



class Drainer:
    """Drains one outbox class.  Thread-safe; keeps a bounded thread pool for sends.

    Build one per outbox and reuse it (the kit does); call ``close()`` when done.
    ``drain()`` and ``drain_once()`` are calls that return; ``start()`` runs
    the background loop that claims on ``wake()`` and at due times.
    ``guard_transport`` wraps every transport it is given (the kit's guard of
    the sends of an outbox whose requests are typed at run time (``Outbox.__runtime_requests__``:
    a ``ScheduledRequestOutbox``), ``outboxkit.transports.guarded``,
    with the settings' allow-list and secrets); such an outbox's drainer
    built without it is guarded with no allow-list and no secrets.
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
        synchronous_commit: bool = True,
        telemetry: Telemetry | None = None,
        attempt_history_days: float = 7.0,
        attempt_body_bytes: int = 0,
        prepared_statements: bool = False,
        outcome_grouping: OutcomeGrouping | None = None,
        guard_transport: Callable[[Transport], Transport] | None = None,
    ) -> None:
        self.engine = engine
        # Wraps every transport this drainer is given, a replaced one too: the sends of requests typed at run time
        # are guarded (outboxkit.transports.guarded); the kit passes its settings' allow-list and secrets, a
        # drainer built by hand guards them with neither.
        if guard_transport is None and outbox.__runtime_requests__ is not None:
            guard_transport = functools.partial(GuardedTransport, guard=UrlGuard())
        self._guard_transport = guard_transport or (lambda transport: transport)
        self.outbox = outbox
        self.options = options or outbox.__outbox__
        if self.options.ordering_key != outbox.__outbox__.ordering_key:
            raise ConfigurationError(
                f"{outbox.__name__}: options may not change ordering_key ({outbox.__outbox__.ordering_key!r} on the "
                f"class, {self.options.ordering_key!r} given): the table's indexes and the claim follow the class"
            )
        self.policy = policy or RetryPolicy(backoff=self.options.backoff, max_attempts=self.options.max_attempts)
        self.clock = clock or SystemClock()
        # Due times, leases and cool-downs follow the database server's clock (outboxkit.storage.database_time).
        self.database_time = DatabaseTime(self.clock)
        self.queries: OutboxQueries = queries_for(
            outbox, synchronous_commit=synchronous_commit, prepared_statements=prepared_statements
        )
        self._lock = threading.Lock()
        self._background: Background[DrainResult] | None = None
        self._closed = False
        self._schema_problems = SchemaProblemLog(logger)
        self.telemetry = telemetry if telemetry is not None else Telemetry()  # hooks; no-ops unless attached
        # Attempt history (outboxkit.storage.attempts) and the operator's pause (outboxkit.storage.pauses).
        self.attempt_log = AttemptLog(
            self.job_name,
            keep_days=attempt_history_days,
            table=self.queries.table_name,
            ordered=self.queries.ordered,
            prepared_statements=prepared_statements,
            on_dropped=lambda records: self.telemetry.attempts_dropped(self.job_name, records),
            body_bytes=attempt_body_bytes,
        )
        self.pause_check = PauseCheck(engine, self.job_name)
        # The steps: claim, then build, send and record, run by the pump.
        self.claimer = Claimer(
            engine, self.queries, options=self.options, policy=self.policy, clock=self.database_time,
            telemetry=self.telemetry, pause_check=self.pause_check,
        )
        self.gate = DestinationGate(engine, outbox, options=self.options)  # breakers and caps (outboxkit.destinations.gate)
        self.recorder = Recorder(
            engine, self.queries, job_name=self.job_name, policy=self.policy, clock=self.database_time,
            telemetry=self.telemetry, attempt_log=self.attempt_log, gate=self.gate,
            lease=timedelta(seconds=self.options.lease_seconds),
        )
        self.pump: SendPump[DrainResult] = SendPump(
            engine, self.queries, options=self.options, transport=self._sending(transport),
            clock=self.database_time, telemetry=self.telemetry,
            claimer=self.claimer, recorder=self.recorder, gate=self.gate, schema_problems=self._schema_problems,
            end_spell=self._end_spell,
            grouping=outcome_grouping,
            wakeups=Wakeups(channel_for(outbox)),
        )

    @property
    def job_name(self) -> str:
        return self.options.job_name

    @property
    def transport(self) -> Transport:
        """Where the sends go (wrapped to sign them when the outbox signs); replacing it applies to the next send."""
        return self.pump.transport

    @transport.setter
    def transport(self, transport: Transport) -> None:
        self.pump.transport = self._sending(transport)

    def _sending(self, transport: Transport) -> Transport:
        return self.options.sending_transport(self._guard_transport(transport))

    @property
    def in_flight(self) -> int:
        """Rows this drainer holds now, between claim and recorded outcome (all its drains together)."""
        return self.pump.in_flight.held + self.pump.hung.count  # a hung send gave its place back, not its row

    def close(self) -> None:
        """Stop the background loop, wait for sends in flight, then release the thread pool."""
        self.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.pump.senders.shutdown()

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
        state = self.pump.new_state()
        events = CallEvents(self.pump.in_flight)

        def may_claim() -> bool:
            if max_claims is not None and result.batches >= max_claims:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            return not (stop is not None and stop.is_set())

        try:
            self.pump.pump(result, state, events, may_claim=may_claim, background=None)
        except Exception as exc:  # a database outage must not escape into a scheduler
            described = self._schema_problems.report(exc, self.outbox)  # a missing table: said once, with the fix
            result.error = described or f"{type(exc).__name__}: {exc}"
            result.schema_problem = described is not None
            if described is None:
                logger.error("%s: drain failed: %s", self.job_name, result.error,
                             extra=log_fields("drain.failed", self.job_name))
            self._settle(state, events)
        self.recorder.report(result)
        self.telemetry.drain_finished(self.job_name, result, loop=False)
        return result

    def _settle(self, state: PumpState, events: CallEvents) -> None:
        """After an error: return at once, leaving this call's sends still out to finish on their own.

        Their outcomes are not written: each row keeps its lease and comes
        due again when it ends, a redelivery with the same key, never a loss.
        Each frees its in-flight slot as it finishes (by its deadline), so
        the bound on rows held stays true without this call waiting.
        """
        events.abandon()
        state.in_flight = state.hung = 0

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
            background = Background(DrainResult(job_name=self.job_name), poll_seconds)
            background.thread = threading.Thread(
                target=self._serve, args=(background,), name=f"outboxkit-drain-{self.job_name}", daemon=True
            )
            self._background = background
        background.thread.start()

    @property
    def running(self) -> bool:
        """True while the background loop runs (or is finishing its rows in flight)."""
        return self._background is not None

    @property
    def loop_alive(self) -> bool:
        """True while the background loop's thread is alive (False once it died or was stopped)."""
        background = self._background
        return background is not None and background.thread is not None and background.thread.is_alive()

    def wake(self) -> None:
        """Tell the background loop rows may be due now (a NOTIFY, a reset).  Cheap; coalesces."""
        background = self._background
        if background is not None:
            self.pause_check.woken()  # without a listener the wake-up may be a resume (outboxkit.storage.pauses)
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

    def _serve(self, background: Background[DrainResult]) -> None:
        state = self.pump.new_state()
        backoff = FIRST_ERROR_BACKOFF_SECONDS
        while not background.stopping.is_set() or state.in_flight:
            try:
                self.pump.pump(
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
                self.recorder.report(background.result)
                self.telemetry.drain_finished(self.job_name, background.result, loop=True)
                background.result = DrainResult(job_name=self.job_name)
                state.more_due = True
                if background.stopping.wait(backoff) and not state.in_flight:
                    break
                backoff = min(backoff * 2, background.poll_seconds)
            else:
                backoff = FIRST_ERROR_BACKOFF_SECONDS
        self.recorder.report(background.result)

    def _end_spell(self, result: DrainResult) -> DrainResult:
        """The end of a busy spell of the background loop: one summary line, and a fresh result for the next."""
        self.recorder.report(result)
        self.telemetry.drain_finished(self.job_name, result, loop=True)
        return DrainResult(job_name=self.job_name)


def drain_once(
    engine: Engine,
    outbox: type[Outbox],
    *,
    transport: Transport | None = None,
    clock: Clock | None = None,
    policy: RetryPolicy | None = None,
    synchronous_commit: bool = True,
) -> DrainResult:
    """Drain one batch of ``outbox`` with a throwaway ``Drainer``.  Never raises.

    Applications normally call ``OutboxKit.drain_once``, which reuses its
    drainers and their thread pools; this function suits scripts and tests.
    """
    owned_transport = transport is None
    if transport is None:
        from outboxkit.transports.http import HttpTransport

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
