"""Attempt history: every delivery attempt of every row, in ``outboxkit_attempts``.

The drain hands each recorded outcome to its ``AttemptLog`` (outbox, row
id, attempt number, when the send started and finished, the outcome, the
status code, an excerpt of the error, and which process sent it as
``host:pid``), with what an HTTP attempt sent and got back
(``outboxkit.transports.exchange``: method, URL and headers redacted, the
body's size and SHA-256, the answer's status, a few of its headers and the
first bytes of its body; the request body itself only up to
``OutboxKitSettings.attempt_body_bytes``, none by default).  The attempt
number counts on across resets: a reset writes a marker
(``outboxkit.storage.reset_markers``) that carries the number reached, and
each attempt after it adds its own count since the reset.  The log does not add a round trip per row to the drain's hot
path: it buffers records and writes them in one ``INSERT ... SELECT FROM
unnest(...)`` on the drain's outcome connection, when ``FLUSH_ROWS`` have
gathered, when the drain is about to wait with nothing in flight, or when
it waits for a send and the oldest record is ``FLUSH_SECONDS`` old.

The history is for people, not for delivery, so it is written on a
best-effort basis: a failed write is logged and those records are dropped
(delivery goes on; the rows themselves are untouched), and a drainer that
dies loses the records it had not flushed yet (at most ``FLUSH_ROWS``; the
rows are sent again with the same key and those attempts are recorded).

Per-minute figures for the overview's charts go to
``outboxkit_outbox_minutes`` in the same statement as the records
(delivered, failed and stuck attempts per minute, summed over every
drainer), and once a minute each drainer samples its outbox's backlog
there (pending and due rows, the oldest due row's age; with an ordering
key, the rows held behind their key's head are not due; the first drainer
of the minute counts, the others skip).

Retention: each drainer trims its own outbox's history to
``OutboxKitSettings.attempt_history_days`` (7 by default), at most once a
``TRIM_INTERVAL_SECONDS``, in batches of ``TRIM_BATCH_ROWS`` (rows another
trim is deleting are skipped, not waited for); the per-minute figures too.  A history of 0 days records
nothing.  The history outlives a reset, so the reason a row got stuck is
still on its page after it was reset and delivered.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, text

from outboxkit.errors import error_summary
from outboxkit.results import Exchange
from outboxkit.storage.array_literals import integer_array, text_array
from outboxkit.storage.ordering import BACKLOG_KEY_LIMIT, OrderedStatements
from outboxkit.telemetry.log_events import log_fields

__all__ = ["ERROR_EXCERPT_CHARS", "FLUSH_ROWS", "AttemptLog", "AttemptRecord", "sender_identity"]

logger = logging.getLogger(__name__)

ERROR_EXCERPT_CHARS = 500
FLUSH_ROWS = 200
FLUSH_SECONDS = 1.0
TRIM_INTERVAL_SECONDS = 60.0
TRIM_BATCH_ROWS = 5_000
TRIM_MAX_BATCHES = 20
# A history table the kit's migrations have not reached: the migration to run, by SQLSTATE.
_MIGRATIONS = {"42P01": "outboxkit_0003", "42703": "outboxkit_0019"}  # undefined table; undefined column

# One statement, one round trip: the attempts, and their per-minute counts
# for the overview's charts (every drainer adds its own to the same row).
# The attempt number counts on across resets: the row's own count since its last reset, plus the number its
# latest reset marker (outboxkit.storage.reset_markers) carries, when that reset came before this attempt's claim.
# Both times are the database server's: the marker's is the reset's, the claim's is its lease's end less the lease
# (a host clock could differ by more than the few milliseconds between a reset and the claim its NOTIFY wakes).
_INSERT = """
WITH logged AS (
    INSERT INTO outboxkit_attempts
        (outbox, row_id, attempt, started_at, finished_at, outcome, status_code, error, request, response, sender)
    SELECT CAST(%(outbox)s AS text), record.row_id,
           record.attempt + COALESCE((
               SELECT marker.attempt FROM outboxkit_attempts AS marker
               WHERE marker.outbox = CAST(%(outbox)s AS text) AND marker.row_id = record.row_id
                 AND marker.outcome = 'reset' AND marker.finished_at <= record.claimed_at
               ORDER BY marker.finished_at DESC, marker.id DESC LIMIT 1
           ), 0),
           record.started_at, record.finished_at, record.outcome, record.code, record.error,
           CAST(record.request AS jsonb), CAST(record.response AS jsonb), CAST(%(sender)s AS text)
    FROM unnest(
        %(row_ids)s::bigint[], %(attempts)s::integer[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
        %(outcomes)s::text[], %(codes)s::smallint[], %(errors)s::text[], %(requests)s::text[], %(responses)s::text[],
        %(claimed)s::timestamptz[]
    ) AS record(row_id, attempt, started_at, finished_at, outcome, code, error, request, response, claimed_at)
    RETURNING finished_at, outcome
)
INSERT INTO outboxkit_outbox_minutes AS minutes (outbox, minute, delivered, failed, stuck)
SELECT CAST(%(outbox)s AS text), date_trunc('minute', finished_at, 'UTC'),
       count(*) FILTER (WHERE outcome = 'done'),
       count(*) FILTER (WHERE outcome IN ('retry', 'stuck')),
       count(*) FILTER (WHERE outcome = 'stuck')
FROM logged GROUP BY 2
ON CONFLICT (outbox, minute) DO UPDATE SET
    delivered = minutes.delivered + EXCLUDED.delivered,
    failed = minutes.failed + EXCLUDED.failed,
    stuck = minutes.stuck + EXCLUDED.stuck
"""

_TRIM = """
DELETE FROM outboxkit_attempts WHERE id IN (
    SELECT id FROM outboxkit_attempts WHERE outbox = CAST(%(outbox)s AS text) AND finished_at < CAST(%(cutoff)s AS timestamptz)
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)
"""
_TRIM_MINUTES = (
    "DELETE FROM outboxkit_outbox_minutes WHERE outbox = CAST(%(outbox)s AS text) AND minute < CAST(%(cutoff)s AS timestamptz)"
)

# The backlog once a minute: the first drainer to get there counts, the
# others find the minute sampled and skip the counting (the NOT EXISTS is
# evaluated first, once).
_SAMPLE = """
INSERT INTO outboxkit_outbox_minutes AS minutes (outbox, minute, pending, due, oldest_due_seconds)
SELECT CAST(%(outbox)s AS text), CAST(%(minute)s AS timestamptz), counts.pending, counts.due,
       EXTRACT(EPOCH FROM (CAST(%(now)s AS timestamptz) - counts.oldest))
FROM (
    SELECT count(*) AS pending,
           count(*) FILTER (WHERE next_attempt_at <= CAST(%(now)s AS timestamptz)) AS due,
           min(next_attempt_at) FILTER (WHERE next_attempt_at <= CAST(%(now)s AS timestamptz)) AS oldest
    FROM {table} WHERE status = 'pending'
) AS counts
WHERE NOT EXISTS (
    SELECT FROM outboxkit_outbox_minutes
    WHERE outbox = CAST(%(outbox)s AS text) AND minute = CAST(%(minute)s AS timestamptz) AND pending IS NOT NULL
)
ON CONFLICT (outbox, minute) DO UPDATE SET
    pending = EXCLUDED.pending, due = EXCLUDED.due, oldest_due_seconds = EXCLUDED.oldest_due_seconds
"""

# The same sample for an outbox with an ordering key: pending counts every pending row, but due and the
# oldest due age count only the rows a claim could take, never those held behind their key's head
# ({backlog}: outboxkit.storage.ordering.ORDERED_BACKLOG).  SQLAlchemy's style, compiled to psycopg's below.
_ORDERED_SAMPLE = """
INSERT INTO outboxkit_outbox_minutes AS minutes (outbox, minute, pending, due, oldest_due_seconds)
SELECT CAST(:outbox AS text), CAST(:minute AS timestamptz),
       (SELECT count(*) FROM {table} WHERE status = 'pending'),
       backlog.due_unkeyed + backlog.due_heads,
       EXTRACT(EPOCH FROM (CAST(:now AS timestamptz)
                           - LEAST(backlog.oldest_due_head, backlog.beyond_oldest_due, backlog.oldest_due_unkeyed)))
FROM ({backlog}) AS backlog
WHERE NOT EXISTS (
    SELECT FROM outboxkit_outbox_minutes
    WHERE outbox = CAST(:outbox AS text) AND minute = CAST(:minute AS timestamptz) AND pending IS NOT NULL
)
ON CONFLICT (outbox, minute) DO UPDATE SET
    pending = EXCLUDED.pending, due = EXCLUDED.due, oldest_due_seconds = EXCLUDED.oldest_due_seconds
"""


def _ordered_sample(table: str, ordered: OrderedStatements) -> str:
    from sqlalchemy.dialects.postgresql import psycopg

    statement = text(_ORDERED_SAMPLE.format(table=table, backlog=ordered.backlog_sql()))
    return str(statement.compile(dialect=psycopg.dialect()))  # type: ignore[no-untyped-call]


def _text(content: bytes) -> str:
    """Bytes as the history shows them: UTF-8, anything else (and NUL, which text columns refuse) replaced."""
    return content.decode("utf-8", "replace").replace("\x00", "\ufffd")


def request_json(exchange: Exchange | None, body_bytes: int) -> str | None:
    """The ``request`` column of an attempt: method, URL, headers, the body's size and hash, and (opted in) its
    first ``body_bytes``."""
    if exchange is None:
        return None
    body = exchange.body[:body_bytes] if exchange.body is not None and body_bytes > 0 else None
    return json.dumps(
        {
            "method": exchange.method,
            "url": exchange.url,
            "headers": [list(header) for header in exchange.request_headers],
            "body_size": exchange.body_size,
            "body_sha256": exchange.body_sha256,
            "body": _text(body) if body is not None else None,
            "body_truncated": body is not None and len(body) < exchange.body_size,
        }
    )


def response_json(exchange: Exchange | None) -> str | None:
    """The ``response`` column of an attempt: status, selected headers, the body's first bytes; None: no answer."""
    if exchange is None or exchange.status is None:
        return None
    return json.dumps(
        {
            "status": exchange.status,
            "headers": [list(header) for header in exchange.response_headers],
            "body": _text(exchange.response_excerpt),
            "body_size": exchange.response_size,
            "body_truncated": len(exchange.response_excerpt) < (exchange.response_size or 0),
        }
    )


def sender_identity() -> str:
    """``host:pid`` of this process (read each time: a forked worker has its own pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt as the history keeps it."""

    row_id: int
    attempt: int
    started_at: datetime
    finished_at: datetime
    outcome: str  # done, retry, stuck, or lost (the row was reset or claimed again meanwhile)
    status_code: int | None
    error: str | None
    exchange: Exchange | None = None  # what an HTTP attempt sent and got back, redacted (outboxkit.transports.exchange)
    claimed_at: datetime | None = None  # the server's time of the claim (None: started_at stands for it)


class AttemptLog:
    """Buffers one outbox's attempt records and writes them in batches (see the module).  Thread-safe."""

    def __init__(
        self,
        outbox_name: str,
        *,
        keep_days: float,
        table: str | None = None,
        ordered: OrderedStatements | None = None,
        prepared_statements: bool = False,
        on_dropped: Callable[[int], None] | None = None,
        body_bytes: int = 0,
    ) -> None:
        self.outbox_name = outbox_name
        self.body_bytes = body_bytes  # how much of each request body is kept (OutboxKitSettings.attempt_body_bytes)
        # psycopg's prepare= for every statement: False never prepares (a transaction-mode pooler
        # before PgBouncer 1.21 loses prepared statements), True prepares (the operator opted in).
        self.prepare = prepared_statements
        self._on_dropped = on_dropped or (lambda records: None)  # the drainer's telemetry counts them
        self.keep = timedelta(days=keep_days)
        self._sample = _SAMPLE.format(table=table) if table else None
        if table and ordered is not None:
            self._sample = _ordered_sample(table, ordered)
        self._lock = threading.Lock()
        self._records: list[AttemptRecord] = []
        self._oldest = 0.0  # time.monotonic() of the oldest buffered record
        self._next_maintenance = time.monotonic()  # the first flush trims and samples
        self._failing: str | None = None

    @property
    def enabled(self) -> bool:
        return self.keep > timedelta(0)

    @property
    def pending(self) -> int:
        return len(self._records)

    def due(self, *, idle: bool) -> bool:
        """Whether to flush now: a batch has gathered, the drain goes idle, or the oldest record waited long enough.

        An idle drain also flushes, with nothing buffered, once a
        ``TRIM_INTERVAL_SECONDS`` for the trim and the backlog sample.
        """
        if not self.enabled:
            return False
        if not self._records:
            return idle and time.monotonic() >= self._next_maintenance
        return idle or len(self._records) >= FLUSH_ROWS or time.monotonic() - self._oldest >= FLUSH_SECONDS

    def add(self, record: AttemptRecord) -> None:
        if self.enabled:
            with self._lock:
                if not self._records:
                    self._oldest = time.monotonic()
                self._records.append(record)

    def flush(self, connection: Connection, *, now: datetime) -> None:
        """Write the buffered records (and trim, when due) on an AUTOCOMMIT connection.

        A failure is logged (once while it lasts) and the records are
        dropped.  A connection that broke is invalidated and the error
        raised, as the outcome write does, so the drain takes a new one.
        """
        with self._lock:
            records, self._records = self._records, []
        maintenance_due = time.monotonic() >= self._next_maintenance
        if not records and not maintenance_due:
            return
        driver = connection.connection.driver_connection
        try:
            if records:
                driver.execute(_INSERT, self._parameters(records), prepare=self.prepare)  # type: ignore[union-attr]
            if maintenance_due:
                self._next_maintenance = time.monotonic() + TRIM_INTERVAL_SECONDS
                self._maintain(driver, now=now)
        except Exception as exc:
            self._on_dropped(len(records))
            if driver is None or driver.broken or driver.closed:
                connection.invalidate()
                raise
            message = error_summary(exc)
            if message != self._failing:
                self._failing = message
                migration = _MIGRATIONS.get(getattr(exc, "sqlstate", None) or "")
                logger.warning(
                    "%s: could not write the attempt history (%d record(s) dropped; delivery goes on): %s%s",
                    self.outbox_name,
                    len(records),
                    message,
                    f"; run the kit's migration {migration} (`alembic upgrade heads`)" if migration else "",
                    extra=log_fields("attempts.dropped", self.outbox_name, records=len(records)),
                )
        else:
            self._failing = None

    def _parameters(self, records: list[AttemptRecord]) -> dict[str, Any]:
        return {
            "outbox": self.outbox_name,
            "sender": sender_identity(),
            # Array literals written at once (outboxkit.storage.array_literals), not lists psycopg dumps one element at a time.
            "row_ids": integer_array(record.row_id for record in records),
            "attempts": integer_array(record.attempt for record in records),
            "started": text_array(record.started_at for record in records),
            "finished": text_array(record.finished_at for record in records),
            "outcomes": text_array(record.outcome for record in records),
            "codes": integer_array(record.status_code for record in records),
            "errors": text_array(record.error[:ERROR_EXCERPT_CHARS] if record.error else None for record in records),
            "requests": text_array(request_json(record.exchange, self.body_bytes) for record in records),
            "responses": text_array(response_json(record.exchange) for record in records),
            "claimed": text_array(record.claimed_at or record.started_at for record in records),
        }

    def _maintain(self, driver: Any, *, now: datetime) -> None:
        """The retention trim, then this minute's backlog sample."""
        cutoff = now - self.keep
        for _ in range(TRIM_MAX_BATCHES):
            parameters = {"outbox": self.outbox_name, "cutoff": cutoff, "batch": TRIM_BATCH_ROWS}
            deleted = driver.execute(_TRIM, parameters, prepare=self.prepare).rowcount
            if deleted < TRIM_BATCH_ROWS:
                break
        driver.execute(_TRIM_MINUTES, {"outbox": self.outbox_name, "cutoff": cutoff}, prepare=self.prepare)
        if self._sample is not None:
            minute = now.astimezone(timezone.utc).replace(second=0, microsecond=0)
            parameters = {"outbox": self.outbox_name, "minute": minute, "now": now}
            # The ordered sample's walk and unkeyed counts: no cap, as the plain sample counts every pending row.
            parameters |= {"key_limit": BACKLOG_KEY_LIMIT, "cap": None, "with_due": True}
            driver.execute(self._sample, parameters, prepare=self.prepare)
