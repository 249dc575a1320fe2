"""Every SQL statement the kit runs against an outbox table, in one place.

The drain, the admin and the CLI act on rows only through these functions,
so the rules they share (what "due" means, what a claim stamps, which rows a
reset may touch) are written once.  Statements are plain SQL over the
table's quoted name, compiled once per outbox class.

The outcome write is the drain's hot path (one per delivered row), so it
skips SQLAlchemy's statement layer: it runs as one statement on the psycopg
connection of an AUTOCOMMIT pooled connection (``outcome_connection``), which
makes it one round trip and one transaction of its own.  It is a server-side
prepared statement only when the operator opts in
(``OutboxKitSettings.prepared_statements``): a transaction-mode pooler before
PgBouncer 1.21 hands the next execution to a server connection that never
saw the PREPARE (docs/operations.md, "PgBouncer and other poolers").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Connection, Engine, TextClause, column, select, text
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidValueError
from outboxkit.model import LAST_ERROR_LIMIT, Outbox

__all__ = ["OutboxQueries", "queries_for"]

# Oldest due first.  SKIP LOCKED makes concurrent claims disjoint: a row
# another transaction is claiming right now is passed over, not waited for.
# The claim stamps a lease (claimed_until) and a fresh token, counts the
# attempt and moves next_attempt_at to the lease's end, so a row whose worker
# dies comes due again by itself.
# A due row that still carries a claim token was held by a worker that died
# before recording its outcome, and may be the row that killed it.  Such a
# row is claimed alone: otherwise it would be claimed again with the
# batch-mates its crash took down (they share its lease end) and take them
# down again until they too ran out of attempts.  The other candidates it
# locked are left untouched and free again when the claim commits.
# {asynchronous_commit} is, by default, a joined set_config() that is SET
# LOCAL synchronous_commit = off in the same round trip: the claim's commit
# does not wait for the WAL flush (see COMMIT DURABILITY below).
CLAIM_DUE_ROWS = """
WITH candidates AS (
    SELECT id, next_attempt_at, claim_token IS NOT NULL AS orphaned FROM {table}
    WHERE status = 'pending' AND next_attempt_at <= :now
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT id, false AS orphaned FROM candidates WHERE NOT EXISTS (SELECT FROM candidates WHERE orphaned)
    UNION ALL
    (SELECT id, true FROM candidates WHERE orphaned ORDER BY next_attempt_at, id LIMIT 1)
)
UPDATE {table} AS outbox
SET attempts = outbox.attempts + 1,
    claim_token = :token,
    claimed_until = :lease_until,
    next_attempt_at = :lease_until,
    updated_at = :now
FROM due{asynchronous_commit}
WHERE outbox.id = due.id
RETURNING outbox.*, due.orphaned AS outboxkit_orphaned
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
# its lease ran out, is not overwritten by a late outcome.  It stores the
# latest attempt's status code and error as they are (NULL when the attempt
# had none): a delivered row keeps no stale error, and a connection error
# leaves no stale status code.  Run alone in autocommit mode, the statement
# is its own transaction.  Parameters are in psycopg's style, since this
# statement bypasses SQLAlchemy.
RECORD_OUTCOME = """
UPDATE {table}
SET status = %(status)s,
    next_attempt_at = COALESCE(%(next_attempt_at)s, next_attempt_at),
    delivered_at = %(delivered_at)s,
    last_status_code = %(status_code)s,
    last_error = %(error)s,
    claim_token = NULL,
    claimed_until = NULL,
    updated_at = %(now)s
{asynchronous_commit}WHERE id = %(id)s AND claim_token = %(token)s
"""

# Commit durability.  By default the claim and the outcome each join
# set_config('synchronous_commit', 'off', true), which is SET LOCAL for that
# transaction only: its commit does not wait for the WAL flush.  It is
# visible to every other session at once and survives any crash of the
# drainer; only a crash of the PostgreSQL server (or a failover to a replica
# that had not received it) within about three wal_writer_delay periods (600
# ms by default) can forget it.  A forgotten claim leaves the row due again
# with its attempt uncounted, so it is sent once more than ``attempts`` says;
# a forgotten outcome leaves the row claimed until its lease ends, and it is
# sent again.  Either way it is a redelivery with the same Idempotency-Key,
# never a loss.  ``OutboxKitSettings.synchronous_commit = True`` drops the
# set_config(), so both commits wait for the flush (the server's own
# synchronous_commit setting then applies) and every attempt sent is
# counted, at the cost measured in docs/performance.md.
_ASYNCHRONOUS_CLAIM = ", (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit"
_ASYNCHRONOUS_OUTCOME = "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit\n"

# The earliest due time of any pending row (a row in flight counts with its
# lease end): the background loop sleeps until then.  One step of the due index.
EARLIEST_DUE = "SELECT min(next_attempt_at) FROM {table} WHERE status = 'pending'"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One row's outcome, ready to write."""

    row_id: int
    token: uuid.UUID
    status: str
    next_attempt_at: datetime | None
    status_code: int | None
    error: str | None


def claim_sql(table: str, *, synchronous_commit: bool = False) -> str:
    """CLAIM_DUE_ROWS for a quoted table name, in the chosen commit mode (SQLAlchemy ``:name`` parameters)."""
    return CLAIM_DUE_ROWS.format(table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_CLAIM)


def record_outcome_sql(table: str, *, synchronous_commit: bool = False) -> str:
    """RECORD_OUTCOME for a quoted table name, in the chosen commit mode (psycopg ``%(name)s`` parameters)."""
    return RECORD_OUTCOME.format(table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_OUTCOME)


class OutboxQueries:
    """The compiled statements for one outbox class.

    ``synchronous_commit`` chooses whether the claim and the outcome commits
    wait for the WAL flush (see "Commit durability" above).
    """

    def __init__(self, outbox: type[Outbox], *, synchronous_commit: bool = False, prepared_statements: bool = False) -> None:
        self.outbox = outbox
        self.synchronous_commit = synchronous_commit
        self.prepared_statements = prepared_statements
        table = outbox.__table__  # type: ignore[attr-defined]
        quoted = _quote(table)
        self.table_name = quoted
        self._claim: TextClause = text(claim_sql(quoted, synchronous_commit=synchronous_commit))
        self._park: TextClause = text(PARK_EXHAUSTED.format(table=quoted))
        self._record = record_outcome_sql(quoted, synchronous_commit=synchronous_commit)
        self._earliest_due: TextClause = text(EARLIEST_DUE.format(table=quoted))

    def claim_due_rows(
        self, session: Session, *, now: datetime, lease_until: datetime, limit: int, token: uuid.UUID
    ) -> tuple[list[Outbox], bool]:
        """Claim up to ``limit`` due rows in the session's transaction.

        Returns the rows as ORM objects, oldest due first, and whether the
        claim took a row alone because its last worker died holding it.
        Unless ``synchronous_commit``, the claim's commit does not wait for
        the WAL flush (see "Commit durability" above).
        """
        statement = select(self.outbox, column("outboxkit_orphaned", Boolean)).from_statement(self._claim)
        params = {"now": now, "lease_until": lease_until, "limit": limit, "token": token}
        claimed = session.execute(statement, params).all()
        rows = sorted((row for row, _ in claimed), key=lambda row: (row.next_attempt_at, row.id))
        return rows, any(orphaned for _, orphaned in claimed)

    def park_exhausted(self, session: Session, *, ids: list[int], token: uuid.UUID, now: datetime, error: str) -> int:
        result = session.execute(self._park, {"ids": ids, "token": token, "now": now, "error": error[:LAST_ERROR_LIMIT]})
        return result.rowcount  # type: ignore[attr-defined,no-any-return]

    def earliest_due(self, connection: Connection) -> datetime | None:
        """The earliest ``next_attempt_at`` of any pending row, or None when none is pending."""
        return connection.execute(self._earliest_due).scalar_one_or_none()

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
            raise InvalidValueError("record_outcome needs a connection from OutboxQueries.outcome_connection (AUTOCOMMIT)")
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
        cursor = driver.execute(self._record, params, prepare=self.prepared_statements)
        return bool(cursor.rowcount == 1)


def _quote(table: Any) -> str:
    from sqlalchemy.dialects import postgresql

    preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
    return str(preparer.format_table(table))


_COMPILED: dict[tuple[type[Outbox], bool, bool], OutboxQueries] = {}


def queries_for(outbox: type[Outbox], *, synchronous_commit: bool = False, prepared_statements: bool = False) -> OutboxQueries:
    """The statements for ``outbox``, compiled once per class, commit mode and prepare mode."""
    key = (outbox, synchronous_commit, prepared_statements)
    compiled = _COMPILED.get(key)
    if compiled is None:
        options = {"synchronous_commit": synchronous_commit, "prepared_statements": prepared_statements}
        compiled = _COMPILED.setdefault(key, OutboxQueries(outbox, **options))
    return compiled


# ===========================================================================
# Admin queries.  Appended: the admin owns everything below this line; the
# drain's statements above stay untouched.
#
# What an operator sees and does through ``outboxkit.admin`` (and the CLI):
# counts, a keyset page of rows, one row's detail, reset and retry-now.  A row
# a drain holds (pending with a live lease, ``claimed_until > now``) is never
# written: every write re-checks that in its WHERE clause under the row lock,
# so a claim that commits first wins and the admin's update matches nothing.
# No string from a request is ever spliced into SQL: filters are bind
# parameters, and the fragments below are fixed.

from outboxkit.model import STATUSES  # noqa: E402  (kept with the section it serves)

__all__ += [
    "AdminQueries",
    "DeletedBatch",
    "PayloadField",
    "RowDetail",
    "RowFilter",
    "RowState",
    "RowSummary",
    "StatusCounts",
    "admin_queries_for",
]

# Columns the kit owns on every outbox; whatever else a table has is the
# application's payload.
KIT_COLUMNS = frozenset(name for name, annotation in Outbox.__annotations__.items() if str(annotation).startswith("Mapped["))
# Below this many rows in the table, ``done`` is counted exactly (a capped
# scan); above it, it is derived from the planner's row estimate.
DONE_EXACT_LIMIT = 10_000
# Pending and stuck rows are counted exactly up to this many (a scan of their
# partial index that stops there, a few milliseconds); past it the count
# would cost a read of the whole backlog on every overview, so the figure is
# the index's own size-scaled row estimate instead, flagged as one.
COUNT_EXACT_LIMIT = 100_000
LIST_ERROR_CHARS = 200

_ROW_SUMMARY_COLUMNS = (
    "id, status, attempts, next_attempt_at, last_status_code, left(last_error, :error_chars) AS last_error, "
    "length(last_error) AS last_error_length, created_at, updated_at, delivered_at, claimed_until"
)
# Every part reads an index whose size follows the work left, never the
# table: pending and stuck are capped scans of their partial indexes (ordered
# by the index's keys, so the planner cannot pick a table scan that stops
# early only if the rows happen to come first), in-flight rows are found in
# ix_<table>_claimed (``claimed_until > :now`` implies its predicate), the
# oldest due row is the due index's first entry, and the estimates are
# catalog reads: the index's reltuples scaled by its current size, as the
# planner does it.  They are as fresh as the last VACUUM or ANALYZE (growth
# into new index pages shows; growth into pages a vacuum freed does not),
# hence the flag, and a capped count never reports fewer rows than it saw.
STATUS_COUNTS = """
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'pending'
                           ORDER BY next_attempt_at, id LIMIT :cap) AS capped) AS pending,
    (SELECT count(*) FROM {table} WHERE status = 'pending' AND claimed_until > :now) AS in_flight,
    (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'stuck' ORDER BY id LIMIT :cap) AS capped) AS stuck,
    (SELECT min(next_attempt_at) FROM {table} WHERE status = 'pending' AND next_attempt_at <= :now) AS oldest_due_at,
    (SELECT reltuples FROM pg_class WHERE oid = to_regclass(:table_name)) AS total_estimate,
    (SELECT {estimate} FROM pg_class WHERE oid = to_regclass(:due_index)) AS pending_estimate,
    (SELECT {estimate} FROM pg_class WHERE oid = to_regclass(:stuck_index)) AS stuck_estimate
"""
_SCALED_ESTIMATE = (
    "CASE WHEN relpages > 0 AND reltuples >= 0 "
    "THEN reltuples / relpages * (pg_relation_size(oid) / current_setting('block_size')::float8) END"
)

# Retention: one window of ``:window`` rows in id order after ``:after_id``
# (a primary-key range scan, so no index serves retention alone), and delete
# the done rows in it delivered before ``:cutoff``.  The DELETE re-checks
# status and delivered_at on the row it deletes: a row that left ``done``
# after the window was read (an operator's manual update) is re-evaluated
# under its lock and kept.  The window also says how many of its rows were
# created before the cutoff: a window with none means every later id is
# younger still, so the walk can stop.
DELETE_DELIVERED_ROWS = """
WITH scanned AS (
    SELECT id, status, delivered_at, created_at FROM {table}
    WHERE id > :after_id ORDER BY id LIMIT :window
), deleted AS (
    DELETE FROM {table} AS outbox
    USING scanned
    WHERE outbox.id = scanned.id
      AND scanned.status = 'done' AND scanned.delivered_at < :cutoff
      AND outbox.status = 'done' AND outbox.delivered_at < :cutoff
    RETURNING outbox.id
)
SELECT (SELECT count(*) FROM deleted) AS deleted,
       (SELECT max(id) FROM scanned) AS last_id,
       (SELECT count(*) FROM scanned WHERE created_at < :cutoff) AS created_before_cutoff
"""

_RESET = (
    "UPDATE {table} SET status = 'pending', attempts = 0, next_attempt_at = :now, "
    "claimed_until = NULL, claim_token = NULL, updated_at = :now"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class RowFilter:
    """Which rows an operator means; every field narrows (AND), None leaves it out.

    ``error_contains`` is a substring of ``last_error``, ``status_code`` the
    exact last code; ``created_*`` and ``updated_*`` are half-open time ranges
    (``after`` inclusive, ``before`` exclusive); ``attempts_min``/``_max``
    bound the attempts; ``payload_contains`` is a substring of one of the
    application's columns, ``payload_column``, as text (the caller checks
    the column is one of ``AdminQueries.payload_columns``).
    """

    error_contains: str | None = None
    status_code: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    attempts_min: int | None = None
    attempts_max: int | None = None
    payload_column: str | None = None
    payload_contains: str | None = None

    def clauses(self, payload_sql: str | None = None) -> tuple[str, dict[str, Any]]:
        """Fixed SQL fragments and their bind parameters (the strings stay data).

        ``payload_sql`` is the quoted column for ``payload_column``, from
        ``AdminQueries`` (never from a request).
        """
        sql, params = "", dict[str, Any]()
        if self.error_contains:
            sql += " AND last_error ILIKE :error_pattern ESCAPE '\\'"
            params["error_pattern"] = "%" + escape_like(self.error_contains) + "%"
        if self.status_code is not None:
            sql += " AND last_status_code = :status_code"
            params["status_code"] = self.status_code
        for name, column_name, operator in _RANGE_CLAUSES:
            value = getattr(self, name)
            if value is not None:
                sql += f" AND {column_name} {operator} :{name}"
                params[name] = value
        if self.payload_contains and payload_sql is not None:
            sql += f" AND CAST({payload_sql} AS text) ILIKE :payload_pattern ESCAPE '\\'"
            params["payload_pattern"] = "%" + escape_like(self.payload_contains) + "%"
        return sql, params

    @property
    def active(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__dataclass_fields__ if name != "payload_column")

    def as_dict(self) -> dict[str, Any]:
        """The base fields always, the others when set; times as ISO 8601 (it goes into URLs and the audit)."""
        values: dict[str, Any] = {"error_contains": self.error_contains, "status_code": self.status_code}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name not in values and value is not None and not (name == "payload_column" and not self.payload_contains):
                values[name] = value.isoformat() if isinstance(value, datetime) else value
        return values


_RANGE_CLAUSES = (
    ("created_after", "created_at", ">="),
    ("created_before", "created_at", "<"),
    ("updated_after", "updated_at", ">="),
    ("updated_before", "updated_at", "<"),
    ("attempts_min", "attempts", ">="),
    ("attempts_max", "attempts", "<="),
)


def escape_like(value: str) -> str:
    """Make ``%``, ``_`` and ``\\`` match themselves in a LIKE pattern with ``ESCAPE '\\'``."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusCounts:
    """One outbox's counts.  A count is exact only when its ``*_estimated`` flag is False."""

    pending: int
    in_flight: int
    stuck: int
    done: int
    done_estimated: bool
    oldest_due_at: datetime | None
    pending_estimated: bool = False
    stuck_estimated: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class DeletedBatch:
    """What one retention statement did: rows deleted, where the window ended, whether to go on."""

    deleted: int
    last_id: int | None
    created_before_cutoff: int

    @property
    def more_may_follow(self) -> bool:
        """False once the window was empty or held no row created before the cutoff."""
        return self.last_id is not None and self.created_before_cutoff > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSummary:
    """A row as a list shows it: the kit's columns, ``last_error`` cut to ``LIST_ERROR_CHARS``."""

    id: int
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    last_error_length: int | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    claimed_until: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PayloadField:
    """One application column of a row, as text cut in SQL to the preview size."""

    name: str
    type: str
    text: str | None
    length: int | None

    @property
    def truncated(self) -> bool:
        return self.text is not None and self.length is not None and self.length > len(self.text)


@dataclass(frozen=True, kw_only=True, slots=True)
class RowDetail:
    summary: RowSummary
    idempotency_key: uuid.UUID
    claim_token: uuid.UUID | None
    payload: list[PayloadField]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowState:
    """What an action may do with a row, read under its lock."""

    id: int
    status: str
    next_attempt_at: datetime
    claimed_until: datetime | None

    def held(self, now: datetime) -> bool:
        """A drain holds the row: it is pending with a live lease."""
        return self.status == "pending" and self.claimed_until is not None and self.claimed_until > now

    def in_backoff(self, now: datetime) -> bool:
        return self.status == "pending" and not self.held(now) and self.next_attempt_at > now


class AdminQueries:
    """The admin's statements for one outbox class."""

    def __init__(self, outbox: type[Outbox]) -> None:
        from sqlalchemy.dialects import postgresql

        table = outbox.__table__  # type: ignore[attr-defined]
        self.table_name = _quote(table)
        preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
        schema = f"{preparer.quote_schema(table.schema)}." if table.schema else ""
        self.due_index = schema + preparer.quote(f"ix_{table.name}_due_id")
        self.stuck_index = schema + preparer.quote(f"ix_{table.name}_stuck")
        self.payload_columns = [
            (column.name, preparer.quote(column.name), column.type.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
            for column in table.columns
            if column.name not in KIT_COLUMNS
        ]

    def _sql(self, template: str) -> str:
        return template.format(table=self.table_name)

    @property
    def payload_column_names(self) -> list[str]:
        """The application's own columns (what a payload filter may name)."""
        return [name for name, _, _ in self.payload_columns]

    def filter_clauses(self, row_filter: RowFilter) -> tuple[str, dict[str, Any]]:
        """``row_filter.clauses`` with its payload column checked and quoted here (never taken from the request)."""
        quoted = None
        if row_filter.payload_contains:
            by_name = {name: quoted_name for name, quoted_name, _ in self.payload_columns}
            if row_filter.payload_column not in by_name:
                known = ", ".join(by_name) or "none"
                raise InvalidValueError(
                    f"payload_column must be one of this outbox's own columns ({known}), got {row_filter.payload_column!r}"
                )
            quoted = by_name[row_filter.payload_column]
        return row_filter.clauses(quoted)

    def count_matching(self, connection: Connection, *, status: str, row_filter: RowFilter, cap: int) -> int:
        """Rows of one status matching the filter, counted up to ``cap + 1`` (more than ``cap`` means "over cap")."""
        filter_sql, params = self.filter_clauses(row_filter)
        statement = text(
            self._sql(f"SELECT count(*) FROM (SELECT 1 FROM {{table}} WHERE status = :status{filter_sql} LIMIT :cap) AS capped")
        )
        return int(connection.execute(statement, {**params, "status": status, "cap": cap + 1}).scalar_one())

    def find(
        self, connection: Connection, *, row_id: int | None = None, idempotency_key: uuid.UUID | None = None
    ) -> RowSummary | None:
        """The row with this id or idempotency key (each a unique index probe)."""
        column, value = ("id", row_id) if row_id is not None else ("idempotency_key", idempotency_key)
        statement = text(self._sql(f"SELECT {_ROW_SUMMARY_COLUMNS} FROM {{table}} WHERE {column} = :value"))
        row = connection.execute(statement, {"value": value, "error_chars": LIST_ERROR_CHARS}).one_or_none()
        return RowSummary(**row._mapping) if row is not None else None

    def status_counts(self, connection: Connection, *, now: datetime) -> StatusCounts:
        """Pending, in-flight and stuck counts through their partial indexes; ``done`` exact or estimated.

        Pending and stuck are exact up to ``COUNT_EXACT_LIMIT`` and estimated
        past it; ``done`` is exact while the table holds at most
        ``DONE_EXACT_LIMIT`` rows.
        """
        row = connection.execute(
            text(STATUS_COUNTS.format(table=self.table_name, estimate=_SCALED_ESTIMATE)),
            {
                "now": now,
                "cap": COUNT_EXACT_LIMIT + 1,
                "table_name": self.table_name,
                "due_index": self.due_index,
                "stuck_index": self.stuck_index,
            },
        ).one()
        pending, pending_estimated = _capped(row.pending, row.pending_estimate)
        stuck, stuck_estimated = _capped(row.stuck, row.stuck_estimate)
        total_estimate = int(row.total_estimate) if row.total_estimate is not None else -1
        if total_estimate > DONE_EXACT_LIMIT:
            done, estimated = max(0, total_estimate - pending - stuck), True
        else:
            done = connection.execute(
                text(self._sql("SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'done' LIMIT :cap) AS capped")),
                {"cap": DONE_EXACT_LIMIT + 1},
            ).scalar_one()
            estimated = done > DONE_EXACT_LIMIT
        return StatusCounts(
            pending=pending,
            in_flight=row.in_flight,
            stuck=stuck,
            done=done,
            done_estimated=estimated,
            oldest_due_at=row.oldest_due_at,
            pending_estimated=pending_estimated,
            stuck_estimated=stuck_estimated,
        )

    def page(
        self,
        connection: Connection,
        *,
        status: str,
        row_filter: RowFilter,
        after: tuple[Any, ...] | None,
        limit: int,
        before: tuple[Any, ...] | None = None,
    ) -> list[RowSummary]:
        """Up to ``limit`` rows of one status after the keyset position ``after`` (or just before ``before``).

        Pending rows come in due order (``next_attempt_at, id``, the drain's
        index); stuck and done rows newest first (``id`` descending).  The
        position is ``(next_attempt_at, id)`` for pending, ``(id,)`` otherwise.
        ``before`` reads backwards from a page's first row (a previous page)
        and returns the rows in the listing's order, the ones nearest
        ``before`` last.
        """
        if status not in STATUSES:
            raise InvalidValueError(f"status must be one of {STATUSES}, got {status!r}")
        filter_sql, params = self.filter_clauses(row_filter)
        params.update(status=status, limit=limit, error_chars=LIST_ERROR_CHARS)
        position, backwards = (before, True) if before is not None else (after, False)
        if status == "pending":
            order = "next_attempt_at DESC, id DESC" if backwards else "next_attempt_at, id"
            if position is not None:
                filter_sql += f" AND (next_attempt_at, id) {'<' if backwards else '>'} (:after_time, :after_id)"
                params.update(after_time=position[0], after_id=position[1])
        else:
            order = "id" if backwards else "id DESC"
            if position is not None:
                filter_sql += f" AND id {'>' if backwards else '<'} :after_id"
                params["after_id"] = position[0]
        statement = text(
            self._sql(
                f"SELECT {_ROW_SUMMARY_COLUMNS} FROM {{table}} WHERE status = :status{filter_sql} ORDER BY {order} LIMIT :limit"
            )
        )
        rows = [RowSummary(**row._mapping) for row in connection.execute(statement, params)]
        return rows[::-1] if backwards else rows

    def detail(self, connection: Connection, row_id: int, *, preview_chars: int) -> RowDetail | None:
        """One row with its application columns as text, each cut to ``preview_chars`` in SQL."""
        payload_sql = "".join(
            f", left(CAST({quoted} AS text), :preview) AS payload_{index}, length(CAST({quoted} AS text)) AS length_{index}"
            for index, (_, quoted, _) in enumerate(self.payload_columns)
        )
        statement = text(
            self._sql(f"SELECT {_ROW_SUMMARY_COLUMNS}, idempotency_key, claim_token{payload_sql} FROM {{table}} WHERE id = :id")
        )
        params = {"id": row_id, "preview": preview_chars, "error_chars": LAST_ERROR_LIMIT}
        row = connection.execute(statement, params).one_or_none()
        if row is None:
            return None
        values = row._mapping
        summary = RowSummary(**{name: values[name] for name in RowSummary.__dataclass_fields__})
        payload = [
            PayloadField(name=name, type=type_name, text=values[f"payload_{index}"], length=values[f"length_{index}"])
            for index, (name, _, type_name) in enumerate(self.payload_columns)
        ]
        return RowDetail(
            summary=summary, idempotency_key=values["idempotency_key"], claim_token=values["claim_token"], payload=payload
        )

    def lock_row_states(self, connection: Connection, ids: list[int]) -> dict[int, RowState]:
        """Lock the listed rows (in id order, so two admins cannot deadlock) and say where each stands."""
        rows = connection.execute(
            text(
                self._sql(
                    "SELECT id, status, next_attempt_at, claimed_until FROM {table} WHERE id = ANY(:ids) ORDER BY id FOR UPDATE"
                )
            ),
            {"ids": ids},
        )
        return {row.id: RowState(**row._mapping) for row in rows}

    def reset_rows(self, connection: Connection, ids: list[int], *, now: datetime) -> list[int]:
        """Stuck -> pending, attempts 0, due now, claim cleared; only rows still stuck.  Returns the ids reset."""
        statement = text(self._sql(_RESET + " WHERE id = ANY(:ids) AND status = 'stuck' RETURNING id"))
        return sorted(connection.execute(statement, {"ids": ids, "now": now}).scalars())

    def retry_rows_now(self, connection: Connection, ids: list[int], *, now: datetime) -> list[int]:
        """Pending rows in backoff and not held -> due now (attempts kept).  Returns the ids moved."""
        statement = text(
            self._sql(
                "UPDATE {table} SET next_attempt_at = :now, updated_at = :now "
                "WHERE id = ANY(:ids) AND status = 'pending' AND next_attempt_at > :now "
                "AND (claimed_until IS NULL OR claimed_until <= :now) RETURNING id"
            )
        )
        return sorted(connection.execute(statement, {"ids": ids, "now": now}).scalars())

    def count_stuck_matching(self, connection: Connection, row_filter: RowFilter, *, sample_size: int) -> tuple[int, list[int]]:
        """How many stuck rows match, and the newest ``sample_size`` of their ids."""
        filter_sql, params = self.filter_clauses(row_filter)
        count = connection.execute(
            text(self._sql(f"SELECT count(*) FROM {{table}} WHERE status = 'stuck'{filter_sql}")), params
        ).scalar_one()
        sample = connection.execute(
            text(self._sql(f"SELECT id FROM {{table}} WHERE status = 'stuck'{filter_sql} ORDER BY id DESC LIMIT :sample")),
            {**params, "sample": sample_size},
        ).scalars()
        return count, list(sample)

    def delete_delivered_batch(self, connection: Connection, *, cutoff: datetime, after_id: int, window: int) -> DeletedBatch:
        """Delete the ``done`` rows delivered before ``cutoff`` among the ``window`` rows after ``after_id``."""
        row = connection.execute(
            text(self._sql(DELETE_DELIVERED_ROWS)), {"cutoff": cutoff, "after_id": after_id, "window": window}
        ).one()
        return DeletedBatch(deleted=row.deleted, last_id=row.last_id, created_before_cutoff=row.created_before_cutoff)

    def reset_stuck_matching(self, connection: Connection, row_filter: RowFilter, *, now: datetime) -> list[int]:
        """Reset every stuck row matching the filter.  Stuck rows carry no lease, so none is held."""
        filter_sql, params = self.filter_clauses(row_filter)
        # Lock in id order first, so two bulk resets at once queue instead of deadlocking.
        statement = text(
            self._sql(
                f"WITH target AS (SELECT id FROM {{table}} WHERE status = 'stuck'{filter_sql} ORDER BY id FOR UPDATE) "
                + _RESET
                + " FROM target WHERE {table}.id = target.id AND {table}.status = 'stuck' RETURNING {table}.id"
            )
        )
        return sorted(connection.execute(statement, {**params, "now": now}).scalars())


def _capped(count: int, estimate: float | None) -> tuple[int, bool]:
    """A capped count as shown: exact up to the limit, else the estimate (never below the limit)."""
    if count <= COUNT_EXACT_LIMIT:
        return count, False
    return max(COUNT_EXACT_LIMIT + 1, round(estimate or 0)), True


_ADMIN_COMPILED: dict[type[Outbox], AdminQueries] = {}


def admin_queries_for(outbox: type[Outbox]) -> AdminQueries:
    """The admin statements for ``outbox``, compiled once per class."""
    compiled = _ADMIN_COMPILED.get(outbox)
    if compiled is None:
        compiled = _ADMIN_COMPILED.setdefault(outbox, AdminQueries(outbox))
    return compiled
