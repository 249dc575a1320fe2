"""The drain: claim due rows, deliver them, record each outcome.

One ``drain_once`` is one batch, in four steps.  Each step names the
invariant it protects.

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
   (``concurrency``), each with the outbox's timeout, so a receiver that hangs
   costs one slot for one timeout, not the batch, and no database
   transaction is held across network I/O.

4. Record (one short transaction per row, guarded by the claim token).  As
   each send finishes, its outcome is decided by the ``RetryPolicy`` and
   written on its own.  One row's failure never rolls back a neighbour, and a
   row that was reset or claimed again meanwhile is not overwritten.

*Nothing is lost*: if the process dies anywhere, the rows it held stay
``pending`` with ``next_attempt_at`` at the end of their lease, so they come
due again and are sent with the same ``Idempotency-Key`` (at-least-once; a
receiver that dedups on the key makes it effectively-once).  The lease is
checked at start-up to outlast the slowest batch, so a live worker's rows are
not claimed twice.

``drain_once`` never raises into its caller and always returns its
connections: a database error is logged and reported in the result.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from outboxkit.clock import Clock, SystemClock
from outboxkit.errors import DeliveryBuildError
from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import AttemptResult, FailureKind, RetryPolicy
from outboxkit.queries import Outcome, OutboxQueries, queries_for
from outboxkit.transport import Delivery, Transport

__all__ = ["DrainResult", "Drainer", "drain_once"]

logger = logging.getLogger("outboxkit.drain")

@dataclass
class DrainResult:
    """What one drain call did."""

    job_name: str
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    stuck: int = 0
    lost_claims: int = 0  # outcomes not written: the row was reset or re-claimed meanwhile
    error: str | None = None  # a database error that cut the drain short
    batches: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

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


class Drainer:
    """Drains one outbox class.  Thread-safe; keeps a bounded thread pool for sends.

    Build one per outbox and reuse it (the kit does); call ``close()`` when done.
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
    ) -> None:
        self.engine = engine
        self.outbox = outbox
        self.options = options or outbox.__outbox__
        self.policy = policy or RetryPolicy(backoff=self.options.backoff, max_attempts=self.options.max_attempts)
        self.transport = transport
        self.clock = clock or SystemClock()
        self.queries: OutboxQueries = queries_for(outbox)
        self._executor = ThreadPoolExecutor(
            max_workers=self.options.concurrency, thread_name_prefix=f"outboxkit-send-{self.options.job_name}"
        )
        self._closed = False

    @property
    def job_name(self) -> str:
        return self.options.job_name

    def close(self) -> None:
        """Wait for sends in flight, then release the thread pool."""
        if not self._closed:
            self._closed = True
            self._executor.shutdown(wait=True)

    # -- one batch -----------------------------------------------------------

    def drain_once(self) -> DrainResult:
        """Claim, deliver and record one batch.  Never raises."""
        result = DrainResult(job_name=self.job_name)
        try:
            self._drain_batch(result)
        except Exception as exc:  # a database outage must not escape into a scheduler
            result.error = f"{type(exc).__name__}: {exc}"
            logger.error("%s: drain failed: %s", self.job_name, result.error)
        if result.claimed:
            logger.info(
                "%s: claimed %d, delivered %d, retried %d, stuck %d%s",
                self.job_name,
                result.claimed,
                result.delivered,
                result.retried,
                result.stuck,
                f", lost claims {result.lost_claims}" if result.lost_claims else "",
            )
        return result

    def drain(
        self, *, max_batches: int | None = None, max_seconds: float | None = None, stop: threading.Event | None = None
    ) -> DrainResult:
        """Drain batches until no due row is left (or a limit or ``stop`` is reached).  Never raises."""
        total = DrainResult(job_name=self.job_name)
        started = time.monotonic()
        while not (stop is not None and stop.is_set()):
            batch = self.drain_once()
            total.add(batch)
            # A short batch does not mean the outbox is empty: an orphaned row is
            # claimed alone and parked rows are not counted; stop when nothing came.
            if batch.error or (batch.claimed == 0 and batch.stuck == 0):
                break
            if max_batches is not None and total.batches >= max_batches:
                break
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                break
        return total

    def _drain_batch(self, result: DrainResult) -> None:
        result.batches = 1
        token = uuid.uuid4()
        session = Session(self.engine, expire_on_commit=False, autoflush=False)
        try:
            with session.begin():
                now = self.clock.now()
                lease_until = now + timedelta(seconds=self.options.lease_seconds)
                rows = self.queries.claim_due_rows(
                    session, now=now, lease_until=lease_until, limit=self.options.batch_size, token=token
                )
                rows = self._park_exhausted(session, rows, token=token, now=now, result=result)
            result.claimed = len(rows)
            if not rows:
                return
            deliveries, build_failures = self._build(rows)
        finally:
            session.close()

        with self.engine.connect() as connection:
            for row, failure in build_failures:
                self._record(connection, row, token, failure, result)
            for row, attempt in self._send(deliveries):
                self._record(connection, row, token, attempt, result)

    def _park_exhausted(
        self, session: Session, rows: list[Outbox], *, token: uuid.UUID, now, result: DrainResult
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
        logger.warning("%s: parked %d row(s) as stuck: %s", self.job_name, len(exhausted), message)
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
                    "%s: build_delivery failed for row %s\n%s", self.job_name, row.id, traceback.format_exc().rstrip()
                )
                error = f"build_delivery raised {type(exc).__name__}: {exc}"
                failures.append((row, AttemptResult(failure=FailureKind.BUILD, error=error)))
            else:
                deliveries.append((row, delivery))
        return deliveries, failures

    def _send(self, deliveries: list[tuple[Outbox, Delivery]]) -> Iterator[tuple[Outbox, AttemptResult]]:
        """Yield (row, result) as sends finish, at most ``concurrency`` in flight."""
        timeout = self.options.timeout
        pending: dict[Future[AttemptResult], Outbox] = {}
        for row, delivery in deliveries:
            future = self._executor.submit(
                self.transport.send, delivery, idempotency_key=str(row.idempotency_key), timeout=timeout
            )
            pending[future] = row
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                row = pending.pop(future)
                try:
                    attempt = future.result()
                except Exception as exc:  # a transport that broke its contract
                    attempt = AttemptResult(failure=FailureKind.TRANSPORT, error=f"{type(exc).__name__}: {exc}")
                yield row, attempt

    def _record(self, connection, row: Outbox, token: uuid.UUID, attempt: AttemptResult, result: DrainResult) -> None:
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
            logger.error("%s: could not record the outcome of row %s: %s", self.job_name, row.id, exc)
            if connection.invalidated or connection.closed:
                raise
            return
        if not written:
            result.lost_claims += 1
            logger.warning("%s: row %s was reset or claimed again during its delivery; outcome dropped", self.job_name, row.id)
        elif decision.status == "done":
            result.delivered += 1
        elif decision.status == "stuck":
            result.stuck += 1
            logger.warning("%s: row %s is stuck: %s", self.job_name, row.id, error)
        else:
            result.retried += 1


def drain_once(
    engine: Engine,
    outbox: type[Outbox],
    *,
    transport: Transport | None = None,
    clock: Clock | None = None,
    policy: RetryPolicy | None = None,
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
    drainer = Drainer(engine, outbox, transport=transport, clock=clock, policy=policy)
    try:
        return drainer.drain_once()
    finally:
        drainer.close()
        if owned_transport:
            transport.close()
