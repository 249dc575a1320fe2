"""Step 4 of the drain: record the outcomes, in groups, each row guarded by its claim token.

As each send finishes, its outcome is decided by the ``RetryPolicy`` and
written.  Outcomes that finish close together are written as a group: one
``UPDATE`` in autocommit mode (``OutboxQueries.record_outcomes``; a
server-side prepared statement only with ``OUTBOXKIT_PREPARED_STATEMENTS``),
so one round trip, one transaction and, with synchronous commit, one WAL
flush for the group instead of one per row.  The flush was what made
synchronous commit expensive (docs/performance.md).

*Outcomes that can change their destination's state* (an outbox with the
circuit breaker on, ``outboxkit.destinations.gate``: a failure, a
``Retry-After``, the first success after failures) are written with the
destination states they change, in one transaction: the group's statement,
then each destination's state read once under its row lock, the group's
readings applied in order, written once (destinations in name order, so two
drainers lock them in one order).  Both or neither.  If that transaction
fails, each such outcome is written on its own with its destination's
state, and the rest as a group.  With the breaker off (the default) no
state is written.

*Each row stays guarded by its claim token*: the statement updates a row
only where its token still matches, so a row that was reset or claimed
again meanwhile is not overwritten; that is a lost claim for that row
alone, and its neighbours are written.

*One row's bad write never loses a neighbour's outcome*: if the group's
statement fails (a trigger or constraint that rejects one row, a deadlock
with an operator's bulk update), nothing of it was written, and each row of
the group is written again on its own, in its own transaction, as before
grouping.  Only the row whose write fails keeps its lease: it comes due
again when the lease ends, a redelivery with the same key, never a loss.
(A retry alone costs one transaction per row, but only after a failure; a
savepoint per row would cost three statements per row every time.)  A
connection that broke is invalidated and the error raised: none of the
group is written, and every row of it comes due again at its lease's end.

*The wait a group adds is bounded* (``OutcomeGrouping``): the pump
(``outboxkit.drain.pump.gather_group``) takes the outcomes already queued
and waits for more only while other sends are still out, at most
``max_delay`` (default 2 ms) after the first outcome, and for at most
``max_rows`` (default 50) outcomes.  With nothing else in flight an outcome
is written at once: an idle drain adds no latency.  The wait is far inside
the time a send leaves for recording its outcome before the lease ends (a
third of the lease margin, at most ``RECORD_MARGIN_SECONDS`` in
``outboxkit.drain.pump``: 5 s by default), so the lease invariants are
unchanged; and were a lease to end first, the claim token still keeps a
late outcome from overwriting a new claim.

The write stores the latest attempt's status code and error (a delivered
row keeps no stale error).  The telemetry hooks and the attempt history
(``outboxkit.storage.attempts``, written in batches on the same connection) see
each row as before.  The statements are in ``outboxkit.storage.drain_queries``; the drain
overview is ``outboxkit.drain``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy import Connection, Engine

from outboxkit.breaker import Reading
from outboxkit.clock import Clock
from outboxkit.destinations.gate import DestinationGate
from outboxkit.destinations.store import Observation
from outboxkit.drain.claim import DrainCounts
from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox
from outboxkit.policy import AttemptResult, Decision, RetryPolicy
from outboxkit.storage.attempts import AttemptLog, AttemptRecord
from outboxkit.storage.drain_queries import OutboxQueries, Outcome
from outboxkit.telemetry.hooks import Telemetry, log_fields

__all__ = ["FinishedSend", "OutcomeConnection", "OutcomeGrouping", "Recorder"]

logger = logging.getLogger(__name__)

# The defaults of OutcomeGrouping.  At 1,000 rows/s a send finishes about
# every millisecond, so 2 ms gathers a few outcomes per flush under load and
# costs a row at most 2 ms; 50 is the default batch_size, the most rows a
# drainer holds in flight.
DEFAULT_GROUP_MAX_ROWS = 50
DEFAULT_GROUP_MAX_DELAY_SECONDS = 0.002
# A group's wait must stay far inside the record margin a send leaves before its lease ends.
MAX_GROUP_DELAY_SECONDS = 0.1

StepResult = TypeVar("StepResult")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeGrouping:
    """How outcomes are grouped into one transaction (see the module docstring).

    ``max_rows``: at most this many outcomes in one transaction.
    ``max_delay``: seconds an outcome may wait for others to join its group,
    counted from the first outcome, and only while other sends are out
    (0: only the outcomes already queued join).
    """

    max_rows: int = DEFAULT_GROUP_MAX_ROWS
    max_delay: float = DEFAULT_GROUP_MAX_DELAY_SECONDS

    def __post_init__(self) -> None:
        rows = self.max_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 10_000:
            raise ConfigurationError(f"OutcomeGrouping.max_rows must be an integer from 1 to 10000, got {rows!r}")
        delay = self.max_delay
        if (
            isinstance(delay, bool)
            or not isinstance(delay, (int, float))
            or not math.isfinite(delay)
            or not 0 <= delay <= MAX_GROUP_DELAY_SECONDS
        ):
            raise ConfigurationError(
                f"OutcomeGrouping.max_delay must be from 0 to {MAX_GROUP_DELAY_SECONDS:g} seconds, got {delay!r}"
            )


@dataclass(frozen=True, slots=True)
class FinishedSend:
    """One row's attempt, handed from the send pool to the recording thread."""

    row: Outbox
    token: uuid.UUID
    attempt: AttemptResult
    started_at: datetime | None = None  # None: no send started (build_delivery failed)
    destination: str | None = None  # where it was sent (None: no send, or no destination to track)
    hung: bool = False  # it was out past its threshold (outboxkit.drain.hung_sends): its in-flight place was given back then


@dataclass(frozen=True, slots=True)
class _Decided:
    finished: FinishedSend
    decision: Decision
    outcome: Outcome


class OutcomeConnection:
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

    @property
    def held(self) -> Connection | None:
        """The connection if it was checked out already, else None (a reader then takes a short-lived one)."""
        return self._connection

    def run_reconnecting(self, step: Callable[[Connection], StepResult]) -> StepResult:
        """``step`` on the held connection (checked out first if none is), and once more on a fresh one if it
        raised and that connection is found broken (``discard_broken``: a server restart, or an idle timeout that
        ended the session while the loop waited).  Any other failure, or a second one, is raised.  ``step`` must be
        safe to run again after it failed on a dead connection."""
        try:
            return step(self.get())
        except Exception:
            if not self.discard_broken():
                raise
            return step(self.get())

    def discard_broken(self) -> bool:
        """If the held connection broke, close it (invalidated) so ``get`` checks out a fresh one; whether it had."""
        connection = self._connection
        if connection is None:
            return False
        driver = connection.connection.driver_connection if not connection.invalidated else None
        if driver is not None and not driver.broken and not driver.closed:
            return False
        if not connection.invalidated:
            connection.invalidate()
        connection.close()
        self._connection = None
        return True


class Recorder:
    """Decides and writes the outcomes of one outbox's sent rows; keeps its attempt history and summary line."""

    def __init__(
        self,
        engine: Engine,
        queries: OutboxQueries,
        *,
        job_name: str,
        policy: RetryPolicy,
        clock: Clock,
        telemetry: Telemetry,
        attempt_log: AttemptLog,
        gate: DestinationGate | None = None,
        lease: timedelta = timedelta(0),
    ) -> None:
        self.engine = engine
        self.lease = lease  # the claim's lease: a row's claimed_until less it is the server's time of its claim
        self.queries = queries
        self.job_name = job_name
        self.policy = policy
        self.clock = clock
        self.telemetry = telemetry
        self.attempt_log = attempt_log
        self.gate = gate

    def record_group(
        self, connection: Connection, finished: Sequence[FinishedSend], result: DrainCounts
    ) -> list[Decision]:
        """Write a group of outcomes in one transaction; returns the decisions written.

        A row whose claim was lost is counted as such and not written; a
        failing group is written again row by row (see the module docstring).
        """
        now = self.clock.now()
        decided = [self._decide(item, now) for item in finished]
        readings: dict[int, Reading] = {}
        changed: set[str] = set()  # destinations an earlier outcome of the group changes
        for item in decided:
            reading = self._destination_reading(item, now, after_changes=item.finished.destination in changed)
            if reading is not None:
                readings[item.outcome.row_id] = reading
                changed.add(item.finished.destination or "")
        if not readings:
            return self._write_group(connection, decided, result, now=now)
        written = self._write_group_with_destinations(connection, decided, readings, result, now=now)
        if written is not None:
            return [item.decision for item in decided
                    if self._finish(item, item.outcome.row_id in written, result, now=now)]
        decisions: list[Decision] = []
        grouped: list[_Decided] = []
        for item in decided:
            reading = readings.get(item.outcome.row_id)
            if reading is None:
                grouped.append(item)
            elif self._write_with_destination(connection, item, reading, result, now=now):
                decisions.append(item.decision)
        if grouped:
            decisions += self._write_group(connection, grouped, result, now=now)
        return decisions

    def _destination_reading(self, item: _Decided, now: datetime, *, after_changes: bool) -> Reading | None:
        destination = item.finished.destination
        if self.gate is None or destination is None:
            return None
        return self.gate.needs_record(destination, item.finished.attempt, now=now, after_changes=after_changes)

    def _write_group_with_destinations(
        self, connection: Connection, decided: list[_Decided], readings: dict[int, Reading], result: DrainCounts,
        *, now: datetime,
    ) -> set[int] | None:
        """The group's outcomes and the destination states they change in one transaction (BEGIN ... COMMIT on the
        autocommit connection); the ids written, or None when it failed and nothing of it was written."""
        assert self.gate is not None
        driver = connection.connection.driver_connection
        assert driver is not None
        try:
            with driver.transaction():  # every write or none
                written = self.queries.record_outcomes(connection, [item.outcome for item in decided], now=now)
                observed: dict[str, list[Observation]] = {}
                for item in decided:
                    reading = readings.get(item.outcome.row_id)
                    if reading is not None and item.outcome.row_id in written:
                        assert item.finished.destination is not None
                        observed.setdefault(item.finished.destination, []).append(_observation(item, reading))
                for destination in sorted(observed):
                    self.gate.record(connection, destination, observed[destination], now=now)
        except Exception as exc:
            self._raise_if_broken(connection, exc, decided, result)
            logger.warning("%s: could not record a group of %d outcomes with their destinations' states (%s: %s); "
                           "writing each on its own", self.job_name, len(decided), type(exc).__name__, exc,
                           extra=log_fields("drain.group_failed", self.job_name, rows=len(decided)))
            return None
        return written

    def _write_with_destination(
        self, connection: Connection, item: _Decided, reading: Reading, result: DrainCounts, *, now: datetime
    ) -> bool:
        """The outcome and its destination's state in one transaction (BEGIN ... COMMIT on the autocommit connection)."""
        assert self.gate is not None and item.finished.destination is not None
        driver = connection.connection.driver_connection
        assert driver is not None
        try:
            with driver.transaction():  # both writes or neither
                written = self.queries.record_outcome(connection, item.outcome, now=now)
                if written:
                    self.gate.record(connection, item.finished.destination, [_observation(item, reading)], now=now)
        except Exception as exc:
            self._raise_if_broken(connection, exc, [item], result)
            self._write_failed(exc, item, result)
            return False
        return self._finish(item, written, result, now=now)

    def _write_group(
        self, connection: Connection, decided: list[_Decided], result: DrainCounts, *, now: datetime
    ) -> list[Decision]:
        try:
            written = self.queries.record_outcomes(connection, [item.outcome for item in decided], now=now)
        except Exception as exc:
            self._raise_if_broken(connection, exc, decided, result)
            if len(decided) == 1:
                self._write_failed(exc, decided[0], result)
                return []
            logger.warning("%s: could not record a group of %d outcomes (%s: %s); writing each on its own",
                           self.job_name, len(decided), type(exc).__name__, exc,
                           extra=log_fields("drain.group_failed", self.job_name, rows=len(decided)))
            decided, written = self._write_each(connection, decided, result, now=now)
        decisions = []
        for item in decided:
            if self._finish(item, item.outcome.row_id in written, result, now=now):
                decisions.append(item.decision)
        return decisions

    def _decide(self, finished: FinishedSend, now: datetime) -> _Decided:
        attempt = finished.attempt
        decision = self.policy.decide(attempt, attempts=finished.row.attempts, now=now)
        error = None if attempt.succeeded else (attempt.error or decision.reason)
        if decision.status == "stuck" and error and decision.reason not in error:
            error = f"{error} ({decision.reason})"
        outcome = Outcome(
            row_id=finished.row.id,
            token=finished.token,
            status=decision.status,
            next_attempt_at=decision.next_attempt_at,
            status_code=attempt.status_code,
            error=error,
        )
        return _Decided(finished, decision, outcome)

    def _write_each(
        self, connection: Connection, decided: list[_Decided], result: DrainCounts, *, now: datetime
    ) -> tuple[list[_Decided], set[int]]:
        """After a group's statement failed: each row in its own transaction.  Returns those not failed, and the written."""
        kept: list[_Decided] = []
        written: set[int] = set()
        for index, item in enumerate(decided):
            try:
                if self.queries.record_outcome(connection, item.outcome, now=now):
                    written.add(item.outcome.row_id)
            except Exception as exc:
                try:
                    self._raise_if_broken(connection, exc, decided[index:], result)  # none of the rest is written
                except Exception:
                    for done in kept:  # those written before the connection broke are counted and reported
                        self._finish(done, done.outcome.row_id in written, result, now=now)
                    raise
                self._write_failed(exc, item, result)
                continue
            kept.append(item)
        return kept, written

    def _write_failed(self, exc: Exception, item: _Decided, result: DrainCounts) -> None:
        # The row keeps its lease and comes due again when it ends: a
        # redelivery with the same key, never a loss.
        row = item.finished.row
        result.errors.append(f"row {row.id}: {type(exc).__name__}: {exc}")
        logger.error("%s: could not record the outcome of row %s: %s", self.job_name, row.id, exc,
                     extra=log_fields("drain.record_failed", self.job_name, row))

    def _raise_if_broken(
        self, connection: Connection, exc: Exception, decided: Sequence[_Decided], result: DrainCounts
    ) -> None:
        """A connection that broke: invalidated (the pool must not hand it out again) and the error raised.

        None of ``decided`` was written: each row keeps its lease and comes due again when it ends.
        """
        driver = connection.connection.driver_connection
        if driver is None or driver.broken or driver.closed:
            ids = ", ".join(str(item.outcome.row_id) for item in decided)
            result.errors.append(f"row(s) {ids}: {type(exc).__name__}: {exc}")
            logger.error("%s: could not record the outcome of row(s) %s: %s", self.job_name, ids, exc,
                         extra=log_fields("drain.record_failed", self.job_name, rows=len(decided)))
            connection.invalidate()
            raise exc

    def _finish(self, item: _Decided, written: bool, result: DrainCounts, *, now: datetime) -> bool:
        """The attempt history, counts, log lines and telemetry of one row; whether its outcome was written."""
        row, attempt, decision, error = item.finished.row, item.finished.attempt, item.decision, item.outcome.error
        self.attempt_log.add(
            AttemptRecord(
                row_id=row.id,
                attempt=row.attempts,
                started_at=item.finished.started_at or now,
                finished_at=now,
                outcome=("retry" if decision.status == "pending" else decision.status) if written else "lost",
                status_code=attempt.status_code,
                error=error,
                exchange=attempt.exchange,
                claimed_at=row.claimed_until - self.lease if row.claimed_until is not None else None,
            )
        )
        if not written:
            result.lost_claims += 1
            self.telemetry.recorded(self.job_name, row, attempt, "lost_claim", now)
            logger.warning("%s: row %s was reset or claimed again during its delivery; outcome dropped", self.job_name, row.id,
                           extra=log_fields("drain.lost_claim", self.job_name, row))
            return False
        if decision.status == "done":
            result.delivered += 1
        elif decision.status == "stuck":
            result.stuck += 1
            fields = log_fields("drain.row_stuck", self.job_name, row, status="stuck", status_code=attempt.status_code)
            logger.warning("%s: row %s is stuck: %s", self.job_name, row.id, error, extra=fields)
        else:
            result.retried += 1
        self.telemetry.recorded(self.job_name, row, attempt, decision.status, now)
        return True

    def flush_attempts(self, outcomes: OutcomeConnection) -> None:
        """Write the attempt history (outboxkit.storage.attempts) on the outcome connection, which holds it.

        The minute's upkeep alone (nothing buffered) takes a short-lived
        connection instead, so an idle loop holds no pool slot.
        """
        if self.attempt_log.pending:
            self.attempt_log.flush(outcomes.get(), now=self.clock.now())
            return
        with self.queries.outcome_connection(self.engine) as connection:
            self.attempt_log.flush(connection, now=self.clock.now())

    def report(self, result: DrainCounts) -> None:
        """The summary line of a drain call or a busy spell, when it claimed or parked rows."""
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


def _observation(item: _Decided, reading: Reading) -> Observation:
    row = item.finished.row
    return Observation(reading, row.id, item.finished.attempt.status_code, item.outcome.error, row.claimed_until)
