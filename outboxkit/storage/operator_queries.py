"""The operator's statements: what ``outboxkit.admin``, the CLI, the metrics and retention run on an outbox table.

Counts, a keyset page of rows, one row's detail, reset and retry-now, the
due count of "drain now", and retention's delete of old delivered rows.  The
drain's own statements (claim, park, outcome, earliest due) live in
``outboxkit.storage.drain_queries``; the filter an operator narrows rows with is
``outboxkit.storage.row_filter``.

A row a drain holds (pending with a live lease, ``claimed_until > now``) is
never written: every write re-checks that in its WHERE clause under the row
lock, so a claim that commits first wins and the admin's update matches
nothing.  No string from a request is ever spliced into SQL: filters are
bind parameters, and the fragments below are fixed.

One module: one statement per operator question on one outbox table; the ordered backlog's
walk is in ``storage.ordering``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy import inspect as sqlalchemy_inspect

from outboxkit.errors import InvalidValueError
from outboxkit.model import KIT_COLUMNS as MODEL_KIT_COLUMNS
from outboxkit.model import LAST_ERROR_LIMIT, STATUSES, Outbox
from outboxkit.storage.drain_queries import quote_table
from outboxkit.storage.operator_results import (
    DeletedBatch,
    OrderedBacklog,
    PayloadField,
    RowDetail,
    RowState,
    RowSummary,
    StatusCounts,
)
from outboxkit.storage.ordering import BACKLOG_KEY_LIMIT, ordered_statements
from outboxkit.storage.per_outbox import PerOutbox
from outboxkit.storage.reset_markers import MARKERS, marker_parameters
from outboxkit.storage.row_filter import RowFilter
from outboxkit.target_secrets import redacted_headers_sql, redacted_url_sql

__all__ = ["AdminQueries", "admin_queries_for"]

# Columns the kit owns on every outbox; whatever else a table has is the
# application's payload.
KIT_COLUMNS = MODEL_KIT_COLUMNS
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
# The relations that hold rows: a plain table (or index) itself, or each partition of a partitioned one
# (whose own catalog row holds no statistics of its rows; pg_partition_tree lists nothing for a plain table).
_LEAVES = (
    "SELECT oid FROM pg_class WHERE oid = to_regclass(:{parameter}) AND relkind NOT IN ('p', 'I') "
    "UNION ALL SELECT relid FROM pg_partition_tree(to_regclass(:{parameter})) WHERE isleaf AND level > 0"
)
# Every part reads an index whose size follows the work left, never the
# table: pending and stuck are capped scans of their partial indexes (ordered
# by the index's keys, so the planner cannot pick a table scan that stops
# early only if the rows happen to come first), in-flight rows are found in
# ix_<table>_claimed (``claimed_until > :now`` implies its predicate), the
# oldest due row is the due index's first entry, and the estimates are
# catalog reads: the index's reltuples scaled by its current size, as the
# planner does it (summed over the partitions of a partitioned outbox).
# They are as fresh as the last VACUUM or ANALYZE (growth into new index
# pages shows; growth into pages a vacuum freed does not), hence the flag,
# and a capped count never reports fewer rows than it saw.
STATUS_COUNTS = """
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'pending'
                           ORDER BY next_attempt_at, id LIMIT :cap) AS capped) AS pending,
    (SELECT count(*) FROM {table} WHERE status = 'pending' AND claimed_until > :now) AS in_flight,
    (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'stuck' ORDER BY id LIMIT :cap) AS capped) AS stuck,
    (SELECT min(next_attempt_at) FROM {table} WHERE status = 'pending' AND next_attempt_at <= :now) AS oldest_due_at,
    (SELECT CASE WHEN bool_or(reltuples >= 0) THEN sum(greatest(reltuples, 0)) ELSE -1 END
     FROM pg_class WHERE oid IN (<leaves of table_name>)) AS total_estimate,
    (SELECT sum({estimate}) FROM pg_class WHERE oid IN (<leaves of due_index>)) AS pending_estimate,
    (SELECT sum({estimate}) FROM pg_class WHERE oid IN (<leaves of stuck_index>)) AS stuck_estimate
"""
for _parameter in ("table_name", "due_index", "stuck_index"):
    STATUS_COUNTS = STATUS_COUNTS.replace(f"<leaves of {_parameter}>", _LEAVES.format(parameter=_parameter))
# Discarded rows, a capped scan of ix_<table>_discarded (apart from STATUS_COUNTS: few tables hold any).
_DISCARDED_COUNT = (
    "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'discarded' ORDER BY id LIMIT :cap) AS capped"
)
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

# A reset over a ``target`` CTE of (id, attempts), locked: the rows reset, and a marker for each in the attempt
# history (outboxkit.storage.reset_markers), in one statement.
_MARKED_RESET = (
    "changed AS (" + _RESET + " FROM target WHERE {table}.id = target.id AND {table}.status IN ('stuck', 'discarded') "
    "RETURNING {table}.id, target.attempts AS attempts_before), "
    + MARKERS.replace("{", "{{").replace("}", "}}")
    + " SELECT id FROM changed"
)

# A discard keeps everything the row says about its attempts; only a reset (or a replay) sends it again.
_DISCARD = "UPDATE {table} SET status = 'discarded', updated_at = :now"


def redacted_columns(outbox: type[Outbox]) -> dict[str, Callable[[str], str]]:
    """The payload columns shown redacted, by column name: the URL and headers of requests typed at run time."""
    if outbox.__runtime_requests__ is None:
        return {}
    url, headers = outbox.__runtime_requests__
    columns = sqlalchemy_inspect(outbox).columns  # by attribute, whatever the columns are named
    return {columns[url].name: redacted_url_sql, columns[headers].name: redacted_headers_sql}


class AdminQueries:
    """The admin's statements for one outbox class."""

    def __init__(self, outbox: type[Outbox]) -> None:
        from sqlalchemy.dialects import postgresql

        table = outbox.__table__  # type: ignore[attr-defined]
        self.table_name = quote_table(table)
        preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
        schema = f"{preparer.quote_schema(table.schema)}." if table.schema else ""
        self.due_index = schema + preparer.quote(f"ix_{table.name}_due_id")
        self.stuck_index = schema + preparer.quote(f"ix_{table.name}_stuck")
        self.outbox_name = outbox.__outbox__.job_name
        ordered = ordered_statements(outbox, self.table_name)
        self._backlog = text(ordered.backlog_sql()) if ordered is not None else None
        self.payload_columns = [
            (column.name, preparer.quote(column.name), column.type.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
            for column in table.columns
            if column.name not in KIT_COLUMNS
        ]
        self._redacted = redacted_columns(outbox)

    def shown(self, name: str, column: str) -> str:
        """SQL for payload column ``name`` (``column``: its quoted reference) as the admin shows, filters and
        exports it: a schedule's request's URL and headers with credentials redacted (``outboxkit.target_secrets``)."""
        redact = self._redacted.get(name)
        return f"({redact(column)})" if redact is not None else column

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
            column = row_filter.payload_column
            quoted = self.shown(str(column), by_name[column])
        return row_filter.clauses(quoted)

    def count_matching(self, connection: Connection, *, status: str, row_filter: RowFilter, cap: int) -> int:
        """Rows of one status matching the filter, counted up to ``cap + 1`` (more than ``cap`` means "over cap")."""
        filter_sql, params = self.filter_clauses(row_filter)
        statement = text(
            self._sql(f"SELECT count(*) FROM (SELECT 1 FROM {{table}} WHERE status = :status{filter_sql} LIMIT :cap) AS capped")
        )
        return int(connection.execute(statement, {**params, "status": status, "cap": cap + 1}).scalar_one())

    def ordered_backlog(self, connection: Connection, *, now: datetime, cap: int, with_due: bool) -> OrderedBacklog | None:
        """Due heads and unkeyed rows of an outbox with an ordering key (None without one); unkeyed counted up to ``cap``,
        the due ones only ``with_due``."""
        if self._backlog is None:
            return None
        parameters = {"now": now, "outbox": self.outbox_name, "key_limit": BACKLOG_KEY_LIMIT, "cap": cap, "with_due": with_due}
        row = connection.execute(self._backlog, parameters).one()
        return OrderedBacklog(**row._mapping)

    def count_due(self, connection: Connection, *, now: datetime, cap: int) -> int:
        """Rows due at ``now`` (what "drain now" reports it found), counted up to ``cap + 1``.

        With an ordering key, the rows held behind their key's head are not due; past the backlog walk's
        key limit the count is a lower bound.
        """
        backlog = self.ordered_backlog(connection, now=now, cap=cap + 1, with_due=True)
        if backlog is not None:
            return min(backlog.due or 0, cap + 1)  # read with_due: never None here
        statement = text(
            self._sql(
                "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'pending' AND next_attempt_at <= :now "
                "LIMIT :cap) AS capped"
            )
        )
        return int(connection.execute(statement, {"now": now, "cap": cap + 1}).scalar_one())

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
        ``DONE_EXACT_LIMIT`` rows.  With an ordering key, ``oldest_due_at`` is
        the oldest row a claim could take (a due head or unkeyed row) and
        ``held_by_order`` counts the pending rows behind their key's head
        (``ordered_backlog``).
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
        discarded = connection.execute(text(self._sql(_DISCARDED_COUNT)), {"cap": COUNT_EXACT_LIMIT + 1}).scalar_one()
        discarded_estimated = discarded > COUNT_EXACT_LIMIT
        total_estimate = int(row.total_estimate) if row.total_estimate is not None else -1
        if total_estimate > DONE_EXACT_LIMIT:
            done, estimated = max(0, total_estimate - pending - stuck - discarded), True
        else:
            done = connection.execute(
                text(self._sql("SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'done' LIMIT :cap) AS capped")),
                {"cap": DONE_EXACT_LIMIT + 1},
            ).scalar_one()
            estimated = done > DONE_EXACT_LIMIT
        counts = StatusCounts(
            pending=pending,
            in_flight=row.in_flight,
            stuck=stuck,
            done=done,
            done_estimated=estimated,
            oldest_due_at=row.oldest_due_at,
            pending_estimated=pending_estimated,
            stuck_estimated=stuck_estimated,
            discarded=min(discarded, COUNT_EXACT_LIMIT),
            discarded_estimated=discarded_estimated,
        )
        backlog = self.ordered_backlog(connection, now=now, cap=COUNT_EXACT_LIMIT + 1, with_due=False)
        if backlog is None:
            return counts
        # Ordered: what is due is the due heads and unkeyed rows; the rows behind the heads are held by order.
        return replace(
            counts,
            oldest_due_at=backlog.oldest_due_at,
            held_by_order=backlog.held_by_order(pending),
            held_by_order_estimated=pending_estimated or backlog.more_keys,
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
            f", left(CAST({shown} AS text), :preview) AS payload_{index}, length(CAST({shown} AS text)) AS length_{index}"
            for index, shown in enumerate(self.shown(name, quoted) for name, quoted, _ in self.payload_columns)
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

    def reset_rows(self, connection: Connection, ids: list[int], *, now: datetime, marker: dict[str, object]) -> list[int]:
        """Stuck or discarded -> pending, attempts 0, due now, claim cleared, a marker in the attempt history
        (``marker``: ``reset_markers.marker_parameters``).  Returns the ids reset."""
        statement = text(
            self._sql(
                "WITH target AS (SELECT id, attempts FROM {table} WHERE id = ANY(:ids) "
                "AND status IN ('stuck', 'discarded') FOR UPDATE), "
                + _MARKED_RESET
            )
        )
        return sorted(connection.execute(statement, {"ids": ids, "now": now, **marker}).scalars())

    def discard_rows(self, connection: Connection, ids: list[int], *, now: datetime) -> list[int]:
        """Stuck -> discarded (kept, never sent; attempts and last error kept).  Returns the ids discarded."""
        statement = text(self._sql(_DISCARD + " WHERE id = ANY(:ids) AND status = 'stuck' RETURNING id"))
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

    def count_stuck_matching(
        self, connection: Connection, row_filter: RowFilter, *, sample_size: int, cap: int
    ) -> tuple[int, list[int]]:
        """How many stuck rows match, counted up to ``cap + 1`` (more than ``cap`` means "over cap"), and the newest
        ``sample_size`` of their ids."""
        filter_sql, params = self.filter_clauses(row_filter)
        count = connection.execute(
            text(self._sql(f"SELECT count(*) FROM (SELECT 1 FROM {{table}} WHERE status = 'stuck'{filter_sql} LIMIT :cap) AS c")),
            {**params, "cap": cap + 1},
        ).scalar_one()
        sample = connection.execute(
            text(self._sql(f"SELECT id FROM {{table}} WHERE status = 'stuck'{filter_sql} ORDER BY id DESC LIMIT :sample")),
            {**params, "sample": sample_size},
        ).scalars()
        return int(count), list(sample)

    def delete_delivered_batch(self, connection: Connection, *, cutoff: datetime, after_id: int, window: int) -> DeletedBatch:
        """Delete the ``done`` rows delivered before ``cutoff`` among the ``window`` rows after ``after_id``."""
        row = connection.execute(
            text(self._sql(DELETE_DELIVERED_ROWS)), {"cutoff": cutoff, "after_id": after_id, "window": window}
        ).one()
        return DeletedBatch(deleted=row.deleted, last_id=row.last_id, created_before_cutoff=row.created_before_cutoff)

    def reset_stuck_batch(
        self,
        connection: Connection,
        row_filter: RowFilter,
        *,
        after_id: int,
        limit: int,
        now: datetime,
        discard: bool = False,
        marker: dict[str, object] | None = None,
    ) -> list[int]:
        """Reset (or discard) up to ``limit`` stuck rows matching the filter with ids above ``after_id``, in id order.

        Returns the ids reset, ascending: fewer than ``limit`` means no matching row is left past ``after_id``.
        Stuck rows carry no lease, so none is held; a row another transaction has locked (another reset of
        it) is skipped, never waited for, and the filter is re-checked on each row under its lock.
        """
        filter_sql, params = self.filter_clauses(row_filter)
        target = (
            f"WITH target AS (SELECT id, attempts FROM {{table}} WHERE status = 'stuck'{filter_sql} AND id > :after_id "
            "ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED)"
        )
        if discard:
            where = " FROM target WHERE {table}.id = target.id AND {table}.status = 'stuck' RETURNING {table}.id"
            sql = f"{target} {_DISCARD}{where}"
        else:
            sql = f"{target}, {_MARKED_RESET}"
        statement = text(self._sql(sql))
        marked = marker if marker is not None else marker_parameters("", "", history=False)
        parameters = {**params, "after_id": after_id, "limit": limit, "now": now, **marked}
        return sorted(connection.execute(statement, parameters).scalars())


def _capped(count: int, estimate: float | None) -> tuple[int, bool]:
    """A capped count as shown: exact up to the limit, else the estimate (never below the limit)."""
    if count <= COUNT_EXACT_LIMIT:
        return count, False
    return max(COUNT_EXACT_LIMIT + 1, round(estimate or 0)), True


_ADMIN_COMPILED: PerOutbox[type[Outbox], AdminQueries] = PerOutbox(AdminQueries)


def admin_queries_for(outbox: type[Outbox]) -> AdminQueries:
    """The admin statements for ``outbox``, compiled once per class."""
    return _ADMIN_COMPILED(outbox)
