"""Step 4 of the drain: record each outcome in its own short transaction, guarded by the claim token.

As each send finishes, its outcome is decided by the ``RetryPolicy`` and
written on its own: one ``UPDATE`` in autocommit mode (a server-side prepared
statement only with ``OUTBOXKIT_PREPARED_STATEMENTS``), so one round trip and
one transaction per row.  One row's failure never rolls back a
neighbour, and a row that was reset or claimed again meanwhile is not
overwritten.  The write stores the latest attempt's status code and error (a
delivered row keeps no stale error).

A write that fails leaves the row with its lease: it comes due again when
the lease ends, a redelivery with the same key, never a loss.  Each outcome
also goes into the attempt history (``outboxkit.attempts``), written in
batches on the same connection.  The statements are in ``outboxkit.queries``;
the drain overview is ``outboxkit.drain``.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import datetime

from sqlalchemy import Connection, Engine

from outboxkit.attempts import AttemptLog, AttemptRecord
from outboxkit.clock import Clock
from outboxkit.destination_gate import DestinationGate
from outboxkit.drain_claim import DrainCounts
from outboxkit.model import Outbox
from outboxkit.policy import AttemptResult, Decision, RetryPolicy
from outboxkit.queries import OutboxQueries, Outcome
from outboxkit.telemetry import Telemetry, log_fields

__all__ = ["OutcomeConnection", "Recorder"]

logger = logging.getLogger("outboxkit.drain")


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


class Recorder:
    """Decides and writes the outcome of each sent row of one outbox; keeps its attempt history and summary line."""

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
    ) -> None:
        self.engine = engine
        self.queries = queries
        self.job_name = job_name
        self.policy = policy
        self.clock = clock
        self.telemetry = telemetry
        self.attempt_log = attempt_log
        self.gate = gate

    def record(
        self,
        connection: Connection,
        row: Outbox,
        token: uuid.UUID,
        attempt: AttemptResult,
        result: DrainCounts,
        *,
        started_at: datetime | None = None,
        destination: str | None = None,
    ) -> Decision | None:
        """Write one outcome; returns the decision, or None if nothing was written.

        When the outcome can change the state of the row's ``destination``
        (``outboxkit.destination_gate``), both are written in one transaction.
        """
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
            written = self._write(connection, outcome, row, attempt, destination, now=now)
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

    def _write(
        self,
        connection: Connection,
        outcome: Outcome,
        row: Outbox,
        attempt: AttemptResult,
        destination: str | None,
        *,
        now: datetime,
    ) -> bool:
        reading = None
        if self.gate is not None and destination is not None:
            reading = self.gate.needs_record(destination, attempt, now=now)
        if reading is None:
            return self.queries.record_outcome(connection, outcome, now=now)  # one statement, its own transaction
        assert self.gate is not None and destination is not None
        driver = connection.connection.driver_connection
        assert driver is not None
        with driver.transaction():  # BEGIN ... COMMIT on the autocommit connection: both writes or neither
            written = self.queries.record_outcome(connection, outcome, now=now)
            if written:
                self.gate.record(
                    connection, destination, reading, row_id=row.id, attempt=attempt, error=outcome.error, now=now
                )
        return written

    def flush_attempts(self, outcomes: OutcomeConnection) -> None:
        """Write the attempt history (outboxkit.attempts) on the outcome connection, which holds it.

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
