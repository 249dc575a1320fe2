"""Every SQL statement the kit runs against an outbox table, in one place.

The drain, the admin and the CLI act on rows only through these functions,
so the rules they share (what "due" means, what a claim stamps, which rows a
reset may touch) are written once.  Statements are plain SQL over the
table's quoted name, compiled once per outbox class.

The outcome write is the drain's hot path (one per delivered row), so it
skips SQLAlchemy's statement layer: it runs as one prepared statement on the
psycopg connection of an AUTOCOMMIT pooled connection (``outcome_connection``),
which makes it one round trip and one transaction of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, select, text
from sqlalchemy.orm import Session

from outboxkit.model import LAST_ERROR_LIMIT, Outbox

__all__ = ["OutboxQueries", "queries_for"]

# Oldest due first.  SKIP LOCKED makes concurrent claims disjoint: a row
# another transaction is claiming right now is passed over, not waited for.
# The claim stamps a lease (claimed_until) and a fresh token, counts the
# attempt and moves next_attempt_at to the lease's end, so a row whose worker
# dies comes due again by itself.
CLAIM_DUE_ROWS = """
WITH due AS (
    SELECT id FROM {table}
    WHERE status = 'pending' AND next_attempt_at <= :now
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS outbox
SET attempts = outbox.attempts + 1,
    claim_token = :token,
    claimed_until = :lease_until,
    next_attempt_at = :lease_until,
    updated_at = :now
FROM due
WHERE outbox.id = due.id
RETURNING outbox.*
"""

# A claimed row whose previous attempt never recorded an outcome (its worker
# died) and which has no attempts left: park it instead of sending again.
# The attempt counted by the claim is taken back, since none is made.
PARK_EXHAUSTED = """
UPDATE {table}
SET status = 'stuck',
    attempts = attempts - 1,
    claim_token = NULL,
    claimed_until = NULL,
    last_error = :error,
    updated_at = :now
WHERE id = ANY(:ids) AND claim_token = :token
"""

# Guarded by the claim token: a row that was reset, or claimed again after
# its lease ran out, is not overwritten by a late outcome.
#
# Run alone in autocommit mode, the statement is its own transaction, and the
# joined set_config() is SET LOCAL synchronous_commit = off for that
# transaction only: the commit does not wait for the WAL flush.  The
# trade-off: if the PostgreSQL server (not the drainer) crashes within about
# three wal_writer_delay periods (600 ms by default) of an outcome, that
# outcome may be forgotten.  The row then still holds its claim, comes due
# when the lease ends and is sent again with the same Idempotency-Key: a
# redelivery, never a loss.  The claim itself keeps synchronous commit, so a
# counted attempt is never forgotten.  Parameters are in psycopg's style,
# since this statement bypasses SQLAlchemy.
RECORD_OUTCOME = """
UPDATE {table}
SET status = %(status)s,
    next_attempt_at = COALESCE(%(next_attempt_at)s, next_attempt_at),
    delivered_at = %(delivered_at)s,
    last_status_code = COALESCE(%(status_code)s, last_status_code),
    last_error = COALESCE(%(error)s, last_error),
    claim_token = NULL,
    claimed_until = NULL,
    updated_at = %(now)s
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit
WHERE id = %(id)s AND claim_token = %(token)s
"""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One row's outcome, ready to write."""

    row_id: int
    token: uuid.UUID
    status: str
    next_attempt_at: datetime | None
    status_code: int | None
    error: str | None


class OutboxQueries:
    """The compiled statements for one outbox class."""

    def __init__(self, outbox: type[Outbox]) -> None:
        self.outbox = outbox
        table = outbox.__table__  # type: ignore[attr-defined]
        quoted = _quote(table)
        self.table_name = quoted
        self._claim: TextClause = text(CLAIM_DUE_ROWS.format(table=quoted))
        self._park: TextClause = text(PARK_EXHAUSTED.format(table=quoted))
        self._record = RECORD_OUTCOME.format(table=quoted)

    def claim_due_rows(
        self, session: Session, *, now: datetime, lease_until: datetime, limit: int, token: uuid.UUID
    ) -> list[Outbox]:
        """Claim up to ``limit`` due rows in the session's transaction; return them as ORM objects."""
        statement = select(self.outbox).from_statement(self._claim)
        params = {"now": now, "lease_until": lease_until, "limit": limit, "token": token}
        rows = list(session.scalars(statement, params))
        rows.sort(key=lambda row: (row.next_attempt_at, row.id))
        return rows

    def park_exhausted(self, session: Session, *, ids: list[int], token: uuid.UUID, now: datetime, error: str) -> int:
        result = session.execute(self._park, {"ids": ids, "token": token, "now": now, "error": error[:LAST_ERROR_LIMIT]})
        return result.rowcount  # type: ignore[attr-defined,no-any-return]

    @staticmethod
    @contextmanager
    def outcome_connection(engine: Engine) -> Iterator[Connection]:
        """A pooled connection in AUTOCOMMIT mode, for ``record_outcome``; returned to the pool on exit."""
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            yield connection

    def record_outcome(self, connection: Connection, outcome: Outcome, *, now: datetime) -> bool:
        """Write one outcome in its own transaction; False if the claim was lost meanwhile.

        ``connection`` comes from ``outcome_connection`` (AUTOCOMMIT), so the
        single statement is its own transaction; anything else is refused
        rather than left in an open transaction.
        """
        driver = connection.connection.driver_connection
        if driver is None or not driver.autocommit:
            raise ValueError("record_outcome needs a connection from OutboxQueries.outcome_connection (AUTOCOMMIT)")
        params: dict[str, Any] = {
            "id": outcome.row_id,
            "token": outcome.token,
            "status": outcome.status,
            "next_attempt_at": outcome.next_attempt_at,
            "delivered_at": now if outcome.status == "done" else None,
            "status_code": outcome.status_code,
            "error": outcome.error[:LAST_ERROR_LIMIT] if outcome.error else None,
            "now": now,
        }
        cursor = driver.execute(self._record, params, prepare=True)
        return cursor.rowcount == 1


def _quote(table: Any) -> str:
    from sqlalchemy.dialects import postgresql

    preparer = postgresql.dialect().identifier_preparer
    return preparer.format_table(table)


@cache
def queries_for(outbox: type[Outbox]) -> OutboxQueries:
    """The (cached) statements for ``outbox``."""
    return OutboxQueries(outbox)
