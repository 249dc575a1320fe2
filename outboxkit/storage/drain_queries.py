"""The drain's SQL: every statement a drain runs against an outbox table.

The claim (with the park of rows out of attempts), the outcome write and the
earliest due time are here, so the rules a drain lives by (what "due" means,
what a claim stamps, which write a lost claim drops) are written once.  The
operator's statements (counts, pages, reset, retry-now, retention) are
``outboxkit.storage.operator_queries``; the kit's own tables (run history, attempts,
pauses, audit) are written by their modules.  Statements are plain SQL over
the table's quoted name, compiled once per outbox class.

The outcome write is the drain's hot path, so it skips SQLAlchemy's
statement layer: it runs as one statement on the psycopg connection of an
AUTOCOMMIT pooled connection (``outcome_connection``), which makes it one
round trip and one transaction of its own, for one row (``record_outcome``)
or for a group of outcomes that finished close together
(``record_outcomes``, one WAL flush for the group).  It is a server-side
prepared statement only when the operator opts in
(``OutboxKitSettings.prepared_statements``): a transaction-mode pooler before
PgBouncer 1.21 hands the next execution to a server connection that never
saw the PREPARE (docs/operations.md, "PgBouncer and other poolers").

The claim and the earliest-due read, on the idle wake-up's path (NOTIFY,
claim, send), skip it too: they run on the psycopg connection of the
connection they are given, prepared as the engine's ``prepare_threshold``
says (as they were through SQLAlchemy), or always when the operator opts in,
and the claim's rows become the model's instances without an ORM Session
(``outboxkit.storage.row_instances``).

One module: each statement with the prose that says which invariant its SQL
keeps, and the drain's rules are meant to be read in one place.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Boolean, Connection, Engine, Executable, Text, TextClause, column, select, text
from sqlalchemy.dialects.postgresql import psycopg as postgresql_psycopg
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidValueError
from outboxkit.model import LAST_ERROR_LIMIT, Outbox
from outboxkit.rate_limits import RateLimit
from outboxkit.storage.array_literals import integer_array, text_array
from outboxkit.storage.database_time import database_time_sql
from outboxkit.storage.destination_claim import (
    ALONE_WALKED_TO,
    OPERATOR_RATES,
    alone_claim_sql,
    destination_claim_sql,
    earliest_due_sql,
)
from outboxkit.storage.destination_claim import WALKED_TO as DESTINATIONS_WALKED_TO
from outboxkit.storage.ordering import KeyCursor, OrderedStatements, ordered_statements
from outboxkit.storage.per_outbox import PerOutbox
from outboxkit.storage.row_instances import RowInstances

__all__ = ["OutboxQueries", "queries_for"]

# A claim walks at most this many destinations (or keys) per row of its batch: one whose destinations are mostly
# blocked or in backoff stops there with a short batch, and the next claim walks on from where it stopped.
WALK_STEPS_PER_ROW = 4
# How long an answer to "has an operator rated a destination of this outbox?" is trusted by a short claim without
# tokens before it asks again (the drain loop's earliest-due reads answer it after nearly every claim anyway).
OPERATOR_RATES_FRESH_SECONDS = 5.0

# The claim: its candidates come from a walk over destinations (outboxkit.storage.destination_claim: blocked
# destinations are not claimed, one probe per cool-down, a fair share per destination) or, with an ordering key,
# over keys (outboxkit.storage.ordering).  SKIP LOCKED makes concurrent claims disjoint: a row another
# transaction is claiming right now is passed over, not waited for.  The claim stamps a lease (claimed_until)
# and a fresh token, counts the attempt and moves next_attempt_at to the lease's end, so a row whose worker
# dies comes due again by itself.  A probe row is not locked by the walk (its state row's conditional UPDATE
# decides who sends it), so the UPDATE below re-checks that it is still pending and due.
# A due row that still carries a claim token was held by a worker that died
# before recording its outcome, and may be the row that killed it.  Such a
# row is claimed alone (with the probes): otherwise it would be claimed again with the
# batch-mates its crash took down (they share its lease end) and take them
# down again until they too ran out of attempts.  The other candidates it
# locked are left untouched and free again when the claim commits.
# {asynchronous_commit} is, when synchronous commit is turned off, a joined
# set_config() that is SET LOCAL synchronous_commit = off in the same round
# trip: the claim's commit does not wait for the WAL flush (see COMMIT
# DURABILITY below).
# {columns} is ``outbox.*``, or (the drain's claim) every column named in the model's order, so the result's
# columns match by position and SQLAlchemy builds the result's metadata once, not on every claim.  Both claims
# return where their walk stopped ({walked_to}), where the next claim starts.
_CLAIM_CANDIDATES = """, due AS (
    SELECT id, false AS orphaned FROM candidates WHERE NOT EXISTS (SELECT FROM candidates WHERE orphaned)
    UNION ALL
    (SELECT id, true FROM candidates WHERE orphaned ORDER BY next_attempt_at, id LIMIT 1)
    UNION ALL
    SELECT id, false FROM probes
)
UPDATE {table} AS outbox
SET attempts = outbox.attempts + 1,
    claim_token = :token,
    claimed_until = :lease_until,
    next_attempt_at = :lease_until,
    updated_at = :now
FROM due{asynchronous_commit}
WHERE outbox.id = due.id AND outbox.status = 'pending' AND outbox.next_attempt_at <= :now
RETURNING {columns}, due.orphaned AS outboxkit_orphaned,
    {walked_to}
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

# A group of outcomes in one statement, so one transaction and one WAL flush
# for the group (see outboxkit.drain.record).  Each row is still guarded by
# its own claim token: a row that was reset or claimed again is left out of
# the update and out of the ids returned, a lost claim for that row alone.
# delivered_at is set for a delivered row only.  Parameters are array
# literals (outboxkit.storage.array_literals), one element per outcome, in psycopg's
# %(name)s style.
RECORD_OUTCOMES = """
UPDATE {table} AS outbox
SET status = outcome.status,
    next_attempt_at = COALESCE(outcome.next_attempt_at, outbox.next_attempt_at),
    delivered_at = CASE WHEN outcome.status = 'done' THEN %(now)s ELSE NULL END,
    last_status_code = outcome.status_code,
    last_error = outcome.error,
    claim_token = NULL,
    claimed_until = NULL,
    updated_at = %(now)s
FROM unnest(
    %(ids)s::bigint[], %(tokens)s::uuid[], %(statuses)s::text[], %(next_attempts)s::timestamptz[],
    %(status_codes)s::smallint[], %(errors)s::text[]
) AS outcome(id, token, status, next_attempt_at, status_code, error){asynchronous_commit}
WHERE outbox.id = outcome.id AND outbox.claim_token = outcome.token
RETURNING outbox.id
"""

# Commit durability.  By default the claim and the outcome commit as the
# server's synchronous_commit says (on, unless the server is set otherwise),
# waiting for the WAL flush, so a server crash forgets neither and every
# attempt sent is counted.  With ``OutboxKitSettings.synchronous_commit =
# False`` each joins set_config('synchronous_commit', 'off', true), which is
# SET LOCAL for that transaction only: its commit does not wait for the WAL
# flush, at a cost measured in docs/performance.md.  It is
# visible to every other session at once and survives any crash of the
# drainer; only a crash of the PostgreSQL server (or a failover to a replica
# that had not received it) within about three wal_writer_delay periods (600
# ms by default) can forget it.  A forgotten claim leaves the row due again
# with its attempt uncounted, so it is sent once more than ``attempts`` says;
# a forgotten outcome leaves the row claimed until its lease ends, and it is
# sent again.  Either way it is a redelivery with the same Idempotency-Key,
# never a loss.
# Joined to a FROM list (the claim, a group of outcomes), or as the FROM list (one outcome):
_ASYNCHRONOUS_JOIN = ", (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit"
_ASYNCHRONOUS_OUTCOME = "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous_commit\n"

# The earliest due time of a row a claim could take (a row in flight counts with its lease end; a blocked
# destination's rows with the time it may go again): the background loop sleeps until then.  One step per
# destination with pending rows (outboxkit.storage.destination_claim), or per key (outboxkit.storage.ordering).


@dataclass(frozen=True, slots=True)
class Outcome:
    """One row's outcome, ready to write."""

    row_id: int
    token: uuid.UUID
    status: str
    next_attempt_at: datetime | None
    status_code: int | None
    error: str | None


def claim_sql(
    table: str, *, synchronous_commit: bool = True, columns: str = "outbox.*", rate_limits: bool = True
) -> str:
    """The claim for a quoted table name, in the chosen commit mode (SQLAlchemy ``:name`` parameters: now,
    lease_until, limit, token, outbox, after; ``database_time_sql`` turns now and lease_until into the server's
    time).  ``columns`` is what it returns of each row; without ``rate_limits`` it takes no tokens (an outbox
    without a limit)."""
    return destination_claim_sql(table, rate_limits=rate_limits) + _CLAIM_CANDIDATES.format(
        table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_JOIN, columns=columns,
        walked_to=DESTINATIONS_WALKED_TO,
    )


def alone_sql(table: str, *, synchronous_commit: bool = True, columns: str = "outbox.*") -> str:
    """The claim of the one destination with pending rows (``storage.destination_claim``), or of nothing."""
    return alone_claim_sql(table) + _CLAIM_CANDIDATES.format(
        table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_JOIN, columns=columns,
        walked_to=ALONE_WALKED_TO,
    )


def ordered_claim_sql(
    statements: OrderedStatements, *, synchronous_commit: bool = True, columns: str = "outbox.*", rate_limits: bool = True
) -> str:
    """The claim of an outbox with an ordering key: its keys' heads (``storage.ordering``), then the claim's second half."""
    return statements.candidates_sql(rate_limits=rate_limits) + _CLAIM_CANDIDATES.format(
        table=statements.table,
        asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_JOIN,
        columns=columns,
        walked_to=statements.walked_to_column(),
    )


def record_outcome_sql(table: str, *, synchronous_commit: bool = True) -> str:
    """RECORD_OUTCOME for a quoted table name, in the chosen commit mode (psycopg ``%(name)s`` parameters)."""
    return RECORD_OUTCOME.format(table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_OUTCOME)


def record_outcomes_sql(table: str, *, synchronous_commit: bool = True) -> str:
    """RECORD_OUTCOMES for a quoted table name, in the chosen commit mode (psycopg ``%(name)s`` parameters)."""
    return RECORD_OUTCOMES.format(table=table, asynchronous_commit="" if synchronous_commit else _ASYNCHRONOUS_JOIN)


class OutboxQueries:
    """The compiled statements for one outbox class.

    ``synchronous_commit`` chooses whether the claim and the outcome commits
    wait for the WAL flush (see "Commit durability" above).
    """

    def __init__(self, outbox: type[Outbox], *, synchronous_commit: bool = True, prepared_statements: bool = False) -> None:
        self.outbox = outbox
        self.job_name = outbox.__outbox__.job_name
        self.synchronous_commit = synchronous_commit
        self.prepared_statements = prepared_statements
        table = outbox.__table__  # type: ignore[attr-defined]
        quoted = quote_table(table)
        self.table_name = quoted
        self.ordered = ordered_statements(outbox, quoted)
        # The claim's statements are built once: building them took a visible share of each claim's CPU.
        returned = [
            *table.c, column("outboxkit_orphaned", Boolean), column("outboxkit_walked_to", Text),
            column("outboxkit_alone", Text),
        ]
        columns = ", ".join(f"outbox.{_quote_name(each.name)}" for each in table.c)
        # Two claims: with the rate limits' tokens, and (an outbox without a limit) without them.
        if self.ordered is None:
            sql, unlimited = (
                database_time_sql(claim_sql(quoted, synchronous_commit=synchronous_commit, columns=columns, rate_limits=limited))
                for limited in (True, False)
            )
            earliest_due = text(database_time_sql(earliest_due_sql(quoted)))
        else:  # an ordering key: the claim takes each key's head (outboxkit.storage.ordering)
            sql, unlimited = (
                database_time_sql(ordered_claim_sql(
                    self.ordered, synchronous_commit=synchronous_commit, columns=columns, rate_limits=limited
                ))
                for limited in (True, False)
            )
            earliest_due = text(database_time_sql(self.ordered.earliest_due_sql()))
        # The claim and the earliest-due read as the driver runs them (psycopg's %(name)s parameters), without
        # SQLAlchemy's statement layer, and how the claim's rows become instances.
        dialect = postgresql_psycopg.dialect()  # type: ignore[no-untyped-call]
        self._claim = _ClaimStatement(text(sql), returned, outbox, dialect)
        self._claim_driver_sql = self._claim.driver_sql
        self._unlimited_claim = _ClaimStatement(text(unlimited), returned, outbox, dialect)
        self._alone = _ClaimStatement(
            text(database_time_sql(alone_sql(quoted, synchronous_commit=synchronous_commit, columns=columns))),
            returned, outbox, dialect,
        )
        self._earliest_due_driver_sql = str(earliest_due.compile(dialect=dialect))
        self._operator_rates_sql = str(text(f"SELECT {OPERATOR_RATES}").compile(dialect=dialect))
        self._prepare = True if prepared_statements else None  # None: the engine's prepare_threshold decides
        self._instances = RowInstances(outbox)
        self._width = len(table.c)
        self._park: TextClause = text(database_time_sql(PARK_EXHAUSTED.format(table=quoted)))
        self._record = record_outcome_sql(quoted, synchronous_commit=synchronous_commit)
        self._record_group = record_outcomes_sql(quoted, synchronous_commit=synchronous_commit)

    def claim_due_rows(
        self,
        connection: Connection,
        *,
        now: datetime | None,
        lease_seconds: float,
        limit: int,
        token: uuid.UUID,
        cursor: KeyCursor | None = None,
        cap: int | None = None,
        breaker: bool | None = None,
        probes: int | None = None,
        rate_limit: RateLimit | None | Literal["class"] = "class",
        operator_rates_check: bool = True,
    ) -> tuple[list[Outbox], bool]:
        """Claim up to ``limit`` due rows on ``connection`` (its own transaction in AUTOCOMMIT mode).

        Returns the rows as instances of the model, oldest due first, and
        whether the claim took a row alone because its last worker died
        holding it.  Unless ``synchronous_commit``, the claim's commit does
        not wait for the WAL flush (see "Commit durability" above).  The
        claim walks the outbox's destinations (or, with an ordering key, its
        keys) from ``cursor``, which it then moves past those it visited; the
        probes of destinations whose cool-down is over are among the rows.
        ``cap`` is the most rows of a suspect destination claimed at once
        across processes (default: the class's ``destination_cap``);
        ``breaker`` says whether outcomes are stored (default: the class's),
        so a destination without a state is not yet proven; ``probes`` is
        how many rows a destination whose cool-down is over sends as its
        probes (default: the class's ``BreakerOptions.probes``);
        ``rate_limit`` the destinations' rate limits (default: the class's),
        whose tokens the claim takes.  An operator's limits of a destination
        (``outboxkit.destinations.limits``) are read in the statement itself
        and replace these for it.  Without a rate limit of the class the claim
        takes no tokens unless ``cursor`` says an operator rated a destination
        (noted by ``earliest_due``); a short claim without tokens whose cursor's
        answer is older than ``OPERATOR_RATES_FRESH_SECONDS`` reads it again
        and, if so, claims the rest of the batch with tokens (not with
        ``operator_rates_check=False``: the drain loop's due read tells it).

        The statement runs on the psycopg connection under ``connection``
        and its rows become detached instances without a Session
        (``outboxkit.storage.row_instances``), unless the model's mapping needs the
        ORM's loading.  It is prepared as the engine's ``prepare_threshold``
        says, or always with ``prepared_statements``.  A connection that
        broke is invalidated before the error is raised.
        """
        params: dict[str, Any] = {
            "now": now, "lease_seconds": lease_seconds, "limit": limit, "token": token, "outbox": self.job_name,
            "cap": cap if cap is not None else self.outbox.__outbox__.destination_cap,
            "unknown_suspect": breaker if breaker is not None else self.outbox.__outbox__.breaker is not None,
            "steps": limit * WALK_STEPS_PER_ROW, "probes": probes if probes is not None else self._probes(),
        }
        limits = self.outbox.__outbox__.rate_limit if rate_limit == "class" else rate_limit
        params.update(rate_parameters(limits))
        cursor = cursor if cursor is not None else KeyCursor()
        rated = limits is not None or cursor.operator_rates
        params["after"] = cursor.after
        rows: list[Outbox] = []
        extras: list[tuple[Any, ...]] = []
        if (  # the common case first (storage.destination_claim); a rate-limited destination takes the walk's tokens
            cursor.alone is not None and self.ordered is None
            and (limits is None or limits.per_second_of(cursor.alone) is None)
        ):
            rows, extras = self._run(connection, self._alone, {**params, "alone": cursor.alone})
        if not rows:
            rows, extras = self._run(connection, self._claim if rated else self._unlimited_claim, params)
            if not rated and operator_rates_check and len(rows) < limit and self._operator_rates_changed(connection, cursor):
                # rows of a destination an operator rated were held back: the rest of the batch takes their tokens
                more = {**params, "limit": limit - len(rows), "steps": (limit - len(rows)) * WALK_STEPS_PER_ROW}
                more_rows, more_extras = self._run(connection, self._claim, more)
                rows, extras = rows + more_rows, more_extras + extras  # the cursor moves as the later claim left it
        cursor.alone = extras[0][2] if extras else None
        if extras:
            cursor.after = extras[0][1]
        order = sorted(range(len(rows)), key=lambda index: (rows[index].next_attempt_at, rows[index].id))
        return [rows[index] for index in order], any(each[0] for each in extras)

    def _run(
        self, connection: Connection, statement: _ClaimStatement, params: dict[str, Any]
    ) -> tuple[list[Outbox], list[tuple[Any, ...]]]:
        """One claim statement: its rows as instances of the model, and each row's extra columns."""
        if self._instances.plain:
            result = self._driver_execute(connection, statement.driver_sql, params)
            claimed = result.fetchall()
            described = result.pgresult
            codes = [described.ftype(index) for index in range(self._width)] if described is not None and claimed else []
            return self._instances.load(connection.dialect, codes, claimed), [tuple(each[self._width:]) for each in claimed]
        # a mapping the ORM must load (outboxkit.storage.row_instances)
        with Session(connection, expire_on_commit=False, autoflush=False) as session:
            loaded = session.execute(statement.orm, params).all()
        return [values[0] for values in loaded], [tuple(values[1:]) for values in loaded]

    def _operator_rates_changed(self, connection: Connection, cursor: KeyCursor) -> bool:
        """After a short claim without tokens: whether operators' rates now exist where the cursor's last answer
        (older than OPERATOR_RATES_FRESH_SECONDS; a fresh one is trusted) said none."""
        if time.monotonic() - cursor.operator_rates_read_at < OPERATOR_RATES_FRESH_SECONDS:
            return False
        found = self._driver_execute(connection, self._operator_rates_sql, {"outbox": self.job_name}).fetchone()
        _note_operator_rates(cursor, bool(found[0]))
        return cursor.operator_rates

    def _probes(self) -> int:
        breaker = self.outbox.__outbox__.breaker
        return 1 if breaker is None else breaker.probes

    def park_exhausted(
        self, connection: Connection, *, ids: list[int], token: uuid.UUID, now: datetime | None, error: str
    ) -> int:
        result = connection.execute(
            self._park, {"ids": ids, "token": token, "now": now, "error": error[:LAST_ERROR_LIMIT]}
        )
        return result.rowcount

    def earliest_due(
        self,
        connection: Connection,
        *,
        now: datetime | None,
        rate_limit: RateLimit | None | Literal["class"] = "class",
        cursor: KeyCursor | None = None,
    ) -> datetime | None:
        """The earliest time a claim could take a row, or None when there is none.

        A row of a blocked destination counts from when its destination may go again (its probe, the end of its
        slow-down; never while it is disabled), a row of a rate-limited one from its next token (``rate_limit``,
        default: the class's); with an ordering key, a row waiting behind its key's head does not count.  The read
        also says whether an operator rated a destination of the outbox, which it notes on ``cursor`` (the drainer's),
        so the drainer's next claims take tokens.
        """
        limits = self.outbox.__outbox__.rate_limit if rate_limit == "class" else rate_limit
        params = {"outbox": self.job_name, "now": now, **rate_parameters(limits)}
        found = self._driver_execute(connection, self._earliest_due_driver_sql, params).fetchone()
        if found is None:
            return None
        if cursor is not None:
            _note_operator_rates(cursor, bool(found[1]))  # its next claims take the tokens of the rates operators set
        due: datetime | None = found[0]
        return due

    def _driver_execute(self, connection: Connection, sql: str, params: dict[str, Any] | None) -> Any:
        """``sql`` on the psycopg connection under ``connection`` (a broken one is invalidated); the cursor.

        Prepared as the engine's ``prepare_threshold`` says, as through
        SQLAlchemy, or always with ``prepared_statements``.
        """
        driver = connection.connection.driver_connection
        try:
            return driver.execute(sql, params, prepare=self._prepare)  # type: ignore[union-attr]
        except Exception:
            if driver is None or driver.broken or driver.closed:
                connection.invalidate()
            raise

    @staticmethod
    @contextmanager
    def outcome_connection(engine: Engine) -> Iterator[Connection]:
        """A pooled connection in AUTOCOMMIT mode, for the claim, the outcomes and the earliest-due read; returned on exit."""
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            yield connection

    def record_outcome(self, connection: Connection, outcome: Outcome, *, now: datetime) -> bool:
        """Write one outcome in its own transaction; False if the claim was lost meanwhile.

        ``connection`` comes from ``outcome_connection`` (AUTOCOMMIT), so the
        single statement is its own transaction; anything else is refused
        rather than left in an open transaction.
        """
        driver = _autocommit_driver(connection, "record_outcome")
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

    def record_outcomes(self, connection: Connection, outcomes: list[Outcome], *, now: datetime) -> set[int]:
        """Write a group of outcomes in one statement, so one transaction; returns the ids written.

        Each row is guarded by its own claim token: an id missing from the
        result was reset or claimed again meanwhile (a lost claim for that
        row only).  If the statement fails, none of the group is written.
        ``connection`` comes from ``outcome_connection`` (AUTOCOMMIT), as
        for ``record_outcome``.
        """
        driver = _autocommit_driver(connection, "record_outcomes")
        params: dict[str, Any] = {  # array literals written at once (outboxkit.storage.array_literals)
            "ids": integer_array(outcome.row_id for outcome in outcomes),
            "tokens": text_array(outcome.token for outcome in outcomes),
            "statuses": text_array(outcome.status for outcome in outcomes),
            "next_attempts": text_array(outcome.next_attempt_at for outcome in outcomes),
            "status_codes": integer_array(outcome.status_code for outcome in outcomes),
            "errors": text_array(outcome.error[:LAST_ERROR_LIMIT] if outcome.error else None for outcome in outcomes),
            "now": now,
        }
        cursor = driver.execute(self._record_group, params, prepare=self.prepared_statements)
        return {row_id for (row_id,) in cursor.fetchall()}


def _note_operator_rates(cursor: KeyCursor, present: bool) -> None:
    """Whether a destination has a rate an operator set (``outboxkit.destinations.limits``), as just read.  Until a
    read says so, the claim without tokens offers none of such a destination's rows, so no claim exceeds its rate."""
    cursor.operator_rates = present
    cursor.operator_rates_read_at = time.monotonic()


def rate_parameters(rate_limit: RateLimit | None) -> dict[str, Any]:
    """The claim's and the earliest-due read's parameters of the destinations' rate limits (none: ``None``)."""
    if rate_limit is None:
        return {"rate_default": None, "rate_names": [], "rate_values": [], "burst_seconds": 1.0}
    return {
        "rate_default": rate_limit.per_second, "rate_names": list(rate_limit.destinations),
        "rate_values": [float(value) for value in rate_limit.destinations.values()],
        "burst_seconds": float(rate_limit.burst_seconds),
    }


class _ClaimStatement:
    """A claim statement as the driver runs it (psycopg's ``%(name)s`` parameters) and as the ORM loads it."""

    def __init__(self, statement: TextClause, returned: list[Any], outbox: type[Outbox], dialect: Any) -> None:
        self.driver_sql = str(statement.compile(dialect=dialect))
        # Its columns are named in the model's order and declared positionally, so the result's metadata is built
        # once and cached with the compiled statement, instead of matched by name on every claim.
        width = len(outbox.__table__.c)  # type: ignore[attr-defined]
        self.orm: Executable = select(outbox, *returned[width:]).from_statement(statement.columns(*returned))


def _autocommit_driver(connection: Connection, method: str) -> Any:
    """The psycopg connection under ``connection``, refused unless it is in AUTOCOMMIT mode.

    Anything else would leave the outcome write in an open transaction.
    """
    driver = connection.connection.driver_connection
    if driver is None or not driver.autocommit:
        raise InvalidValueError(f"{method} needs a connection from OutboxQueries.outcome_connection (AUTOCOMMIT)")
    return driver


def _quote_name(name: str) -> str:
    from sqlalchemy.dialects import postgresql

    return str(postgresql.dialect().identifier_preparer.quote(name))  # type: ignore[no-untyped-call]


def quote_table(table: Any) -> str:
    from sqlalchemy.dialects import postgresql

    preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
    return str(preparer.format_table(table))


_COMPILED: PerOutbox[tuple[type[Outbox], bool, bool], OutboxQueries] = PerOutbox(
    lambda key: OutboxQueries(key[0], synchronous_commit=key[1], prepared_statements=key[2])
)


def queries_for(outbox: type[Outbox], *, synchronous_commit: bool = True, prepared_statements: bool = False) -> OutboxQueries:
    """The statements for ``outbox``, compiled once per class, commit mode and prepare mode."""
    return _COMPILED((outbox, synchronous_commit, prepared_statements))
