"""Step 1 of the drain: claim due rows in one statement that is its own committed transaction.

Up to ``batch_size`` due rows are taken oldest first with ``FOR UPDATE SKIP
LOCKED``; each gets a lease (``claimed_until``), the batch's fresh
``claim_token``, and its attempt is counted.  The statement runs on a
connection in AUTOCOMMIT mode, so it commits by itself: one round trip (no
BEGIN before it, no COMMIT after it), and, with synchronous commit, one WAL
flush, all before any send.  The pump claims on the connection it holds for
its outcomes (the drain loop holds it while idle, so a wake-up claims
without a pool checkout), and the claimed rows become instances of the
application's model without an ORM Session (``outboxkit.storage.row_instances``).

*Disjoint claims*: two drains, in one process or two, never get the same row
while its lease runs.  *Claim before send*: the attempt is committed before
any network call, so a row that kills the worker every time still runs out
of attempts and ends ``stuck``.  Rows whose previous attempt never recorded
an outcome and that have no attempts left are parked as ``stuck`` here
instead of being sent again, by a second statement guarded by the claim's
token that also takes back the attempt the claim counted (a crash between
the two leaves the row claimed: it comes due again at its lease's end and is
parked then, with that one unsent attempt counted, as a claim whose sends
never started always is).  A row still holding the claim of a worker that
died is claimed alone, so a row that kills its worker does not take healthy
batch-mates down with it again.

The claim walks the outbox's destinations in turn from where its previous
claim stopped, and decides in SQL which may go: rows of a destination that
is open, disabled or slowed are not claimed, one row per cool-down goes as
the probe, and the batch is shared fairly across destinations
(``outboxkit.storage.destination_claim``).  An outbox with an ordering key
claims only the head of each key (``outboxkit.storage.ordering``), walking
its keys in turn.

An operator's pause (``outboxkit.storage.pauses``) is checked before each claim: a
paused outbox claims nothing, in every process.  The statements are in
``outboxkit.storage.drain_queries``; the drain overview is ``outboxkit.drain``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Engine

from outboxkit.model import Outbox, OutboxOptions
from outboxkit.policy import RetryPolicy
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.drain_queries import OutboxQueries
from outboxkit.storage.ordering import KeyCursor
from outboxkit.storage.pauses import PauseCheck
from outboxkit.telemetry.hooks import Telemetry, log_fields

__all__ = ["Claimer", "DrainCounts"]

logger = logging.getLogger(__name__)


class DrainCounts(Protocol):
    """What the drain's steps count into: ``outboxkit.drain.drainer.DrainResult`` is one."""

    claimed: int
    delivered: int
    retried: int
    stuck: int
    lost_claims: int
    batches: int
    errors: list[str]
    started: float
    telemetry_links: dict[int, list[Any]]

    @property
    def eventful(self) -> bool: ...

    def as_counts(self) -> dict[str, int]: ...


class Claimer:
    """Claims due rows of one outbox: a lease, a token and a counted attempt, committed before any send."""

    def __init__(
        self,
        engine: Engine,
        queries: OutboxQueries,
        *,
        options: OutboxOptions,
        policy: RetryPolicy,
        clock: DatabaseTime,
        telemetry: Telemetry,
        pause_check: PauseCheck,
    ) -> None:
        self.engine = engine
        self.queries = queries
        self.options = options
        self.policy = policy
        self.clock = clock
        self.telemetry = telemetry
        self.pause_check = pause_check
        self.walk_cursor = KeyCursor()  # the next claim walks the destinations (or an ordered outbox's keys) from here

    @property
    def job_name(self) -> str:
        return self.options.job_name

    def claim(
        self,
        wanted: int,
        result: DrainCounts,
        may_claim: Callable[[], bool] | None = None,
        connection: Connection | None = None,
        *,
        due_read_follows: bool = False,
    ) -> tuple[list[Outbox], uuid.UUID, int, bool]:
        """One committed statement (see the module): take up to ``wanted`` due rows.

        ``connection`` is an AUTOCOMMIT connection the caller holds (the
        pump's outcome connection, ``OutboxQueries.outcome_connection``), so
        a wake-up claims without a pool checkout; without one the claim
        checks out its own.

        The claim decides by the database server's clock (``outboxkit.storage.database_time``): a row is
        due, and its lease ends, by the server's time, whatever this host's clock says.  ``may_claim`` is
        asked again after the claim's time is fixed (a test's ``ManualClock`` is read before it) and just
        before the statement, so a stop that was handled before it always prevents the claim; in
        production the claim's time is the server's at the statement, a round trip later.

        ``due_read_follows``: the drain loop reads the next due time after a short claim, which also says whether an
        operator rated a destination (``OutboxQueries.earliest_due``), so the claim does not ask it itself and adds no
        round trip before the sends.

        Returns (rows to send, token, rows taken, whether the claim took an orphaned row alone).
        """
        token = uuid.uuid4()
        if self.pause_check.paused():
            return [], token, 0, False  # an operator paused this outbox: claim nothing, in every process
        if not result.claimed:
            result.started = time.monotonic()  # a loop's busy spell starts at the claim that finds rows
        with contextlib.ExitStack() as cleanup:
            if connection is None:
                connection = cleanup.enter_context(self.queries.outcome_connection(self.engine))
            self.clock.refresh(connection)  # the server's time for this process's own decisions, read now and then
            now = self.clock.parameter()  # None: the statement's own now() on the server (a test's ManualClock: read here)
            if may_claim is not None and not may_claim():
                return [], token, 0, False
            lease = timedelta(seconds=self.options.lease_seconds)
            sent_at = time.monotonic()
            rows, orphaned = self.queries.claim_due_rows(
                connection, now=now, lease_seconds=lease.total_seconds(), limit=wanted, token=token,
                cursor=self.walk_cursor, cap=self.options.destination_cap, breaker=self.options.breaker is not None,
                probes=self.options.breaker.probes if self.options.breaker is not None else 1,
                rate_limit=self.options.rate_limit, operator_rates_check=not due_read_follows,
            )
            if rows and rows[0].claimed_until is not None:
                self.clock.observe(rows[0].claimed_until - lease, sent_at=sent_at)  # the server's time of the claim, for free
            taken = len(rows)
            rows = self._park_exhausted(connection, rows, token=token, now=now, result=result)
        result.batches += 1
        result.claimed += len(rows)  # parked rows are counted as stuck, not as claimed
        return rows, token, taken, orphaned

    def _park_exhausted(
        self, connection: Connection, rows: list[Outbox], *, token: uuid.UUID, now: datetime | None, result: DrainCounts
    ) -> list[Outbox]:
        exhausted = [row for row in rows if row.attempts > self.policy.max_attempts]
        if not exhausted:
            return rows
        message = (
            f"max attempts ({self.policy.max_attempts}) reached; the last attempt recorded no outcome "
            "(the worker stopped or lost its lease during the delivery)"
        )
        self.queries.park_exhausted(connection, ids=[row.id for row in exhausted], token=token, now=now, error=message)
        result.stuck += len(exhausted)
        self.telemetry.parked(self.job_name, exhausted)
        logger.warning("%s: parked %d row(s) as stuck: %s", self.job_name, len(exhausted), message,
                       extra=log_fields("drain.parked", self.job_name, rows=len(exhausted)))
        parked = {row.id for row in exhausted}
        return [row for row in rows if row.id not in parked]
