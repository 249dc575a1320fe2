"""The partitions of a partitioned outbox (``OutboxOptions.partition_by``): names, ranges, and the statements that
create, fill and drop them.

A partitioned outbox is one table partitioned by range of ``created_at``, one partition per day or week (UTC;
weeks start on Monday), named ``<table>_p<yyyymmdd>`` after the first day it holds, plus a DEFAULT partition
``<table>_pdefault`` that takes any row whose partition does not exist yet.  An insert therefore never fails
for want of a partition.  What each statement protects:

* ``create_partition`` makes one range partition as an empty table (``LIKE`` the parent, with the outbox
  storage parameters), moves the DEFAULT partition's rows of that range into it, and attaches it, all in one
  transaction.  The parent is locked in ``SHARE ROW EXCLUSIVE`` mode first: inserts, claims and outcome
  writes wait the few milliseconds this takes (reads do not), and an insert that waited is routed to the new
  partition, never refused by it.  ``lock_timeout`` bounds the wait for that lock: behind a long transaction
  the creation gives up and the next run tries again, rather than queue every writer behind it.  A row moved
  out of the DEFAULT partition while a drain holds it loses that drain's outcome write (the row is found
  gone); its lease expires and it is sent again with the same idempotency key.
* ``drop_partition_if_done`` locks the parent in ``ACCESS EXCLUSIVE`` mode, then looks for a ``pending`` or
  ``stuck`` row in the partition through the partial indexes, and only if there is none detaches and drops
  it, in the same transaction.  No status can change between the look and the drop: every writer waits
  for the lock, and a write that committed before it is seen.  A partition holding a ``pending`` or
  ``stuck`` row keeps all its rows.
* ``partitions`` reads the existing partitions and their bounds from the catalog, in the database's own
  words (the bounds are cast back to ``timestamptz`` in the same session that printed them).

``OUTBOX_STORAGE_PARAMETERS`` are the autovacuum settings given to every partition the kit creates, and by
the migration helpers to a plain outbox table (docs/operations.md says why each).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import Connection, Engine, text
from sqlalchemy.dialects.postgresql import dialect as postgresql_dialect
from sqlalchemy.exc import DBAPIError

from outboxkit.errors import ConfigurationError
from outboxkit.model import PARTITION_INTERVALS, Outbox, default_partition_name
from outboxkit.telemetry.log_events import log_fields

__all__ = [
    "OUTBOX_STORAGE_PARAMETERS",
    "Partition",
    "PartitionTable",
    "create_partition",
    "drop_partition_if_done",
    "interval_start",
    "overlaps",
    "partition_name",
    "partitions",
    "storage_parameters_sql",
    "timestamp_literal",
    "wanted_ranges",
]

logger = logging.getLogger(__name__)

OUTBOX_STORAGE_PARAMETERS: dict[str, int | float] = {
    # The autovacuum settings docs/operations.md recommends for an outbox table ("Vacuum and table settings").
    # No fillfactor: none of the kit's updates can be HOT (each changes an indexed column), so room left on a
    # page buys nothing (docs/performance.md, "Growth").
    "autovacuum_vacuum_scale_factor": 0.01,  # vacuum after 1% of the rows changed, not 20%
    "autovacuum_vacuum_threshold": 10000,  # plus 10,000, so a small partition is not vacuumed constantly
    "autovacuum_vacuum_insert_scale_factor": 0.05,  # the visibility map fresh for index-only counts
    "autovacuum_analyze_scale_factor": 0.02,  # row estimates (the admin's counts past their cap) stay close
    "autovacuum_vacuum_cost_delay": 1,  # milliseconds: vacuum keeps up on a busy table
}
DEFAULT_LOCK_TIMEOUT_SECONDS = 2.0


def timestamp_literal(moment: datetime) -> str:
    """``moment`` as a SQL literal in UTC (partition bounds are DDL, which takes no bind parameters)."""
    return f"'{moment.astimezone(timezone.utc).isoformat()}'"


def storage_parameters_sql() -> str:
    """``OUTBOX_STORAGE_PARAMETERS`` as a ``WITH (...)`` / ``SET (...)`` list."""
    return ", ".join(f"{name} = {value}" for name, value in OUTBOX_STORAGE_PARAMETERS.items())


@dataclass(frozen=True)
class Partition:
    """One partition: its name and range (``start`` None: from MINVALUE; both None: the DEFAULT partition)."""

    name: str
    start: datetime | None
    end: datetime | None

    @property
    def is_default(self) -> bool:
        return self.start is None and self.end is None


class PartitionTable:
    """The quoted names one partitioned outbox's statements use."""

    def __init__(self, outbox: type[Outbox]) -> None:
        options = outbox.__outbox__
        if options.partition_by is None:
            raise ConfigurationError(f"outbox {options.job_name!r} is not partitioned (partition_by=None)")
        table = outbox.__table__  # type: ignore[attr-defined]
        self.outbox = outbox
        self.name: str = table.name
        self.schema: str | None = table.schema
        self.interval = options.partition_by
        self.ahead = options.partitions_ahead
        self.columns = [column.name for column in table.columns]
        self.parent = self.quoted(self.name)
        self.default = self.quoted(default_partition_name(self.name))

    def quoted(self, name: str) -> str:
        preparer = postgresql_dialect().identifier_preparer  # type: ignore[no-untyped-call]
        schema = f"{preparer.quote_schema(self.schema)}." if self.schema else ""
        return f"{schema}{preparer.quote(name)}"

    def regclass(self, name: str) -> str:
        return f"{self.schema}.{name}" if self.schema else name

    @property
    def column_list(self) -> str:
        preparer = postgresql_dialect().identifier_preparer  # type: ignore[no-untyped-call]
        return ", ".join(preparer.quote(column) for column in self.columns)


def interval_start(moment: datetime, interval: str) -> datetime:
    """The start (UTC midnight; Monday for a week) of the ``interval`` holding ``moment``."""
    day = moment.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday()) if interval == "week" else day


def partition_name(table: str, start: datetime) -> str:
    """``<table>_p<yyyymmdd>``: the partition whose range starts at ``start``."""
    return f"{table}_p{start:%Y%m%d}"


def wanted_ranges(outbox: type[Outbox], now: datetime) -> list[Partition]:
    """The partitions that should exist at ``now``: the current interval and ``partitions_ahead`` after it."""
    options = outbox.__outbox__
    if options.partition_by is None:
        return []
    step = timedelta(days=PARTITION_INTERVALS[options.partition_by])
    first = interval_start(now, options.partition_by)
    table = outbox.__table__.name  # type: ignore[attr-defined]
    starts = [first + step * index for index in range(options.partitions_ahead + 1)]
    return [Partition(partition_name(table, start), start, start + step) for start in starts]


_PARTITIONS = """
SELECT child.relname AS name, bound,
       (regexp_match(bound, $$FROM \\('([^']+)'\\)$$))[1]::timestamptz AS start,
       (regexp_match(bound, $$TO \\('([^']+)'\\)$$))[1]::timestamptz AS "end"
FROM (SELECT inhrelid, pg_get_expr(relpartbound, inhrelid) AS bound
      FROM pg_inherits JOIN pg_class ON pg_class.oid = inhrelid
      WHERE inhparent = to_regclass(:parent)) AS parts
JOIN pg_class AS child ON child.oid = parts.inhrelid
ORDER BY start NULLS FIRST, name
"""


def partitions(connection: Connection, table: PartitionTable) -> list[Partition]:
    """The outbox's partitions now, oldest first (MINVALUE and DEFAULT first)."""
    rows = connection.execute(text(_PARTITIONS), {"parent": table.regclass(table.name)}).all()
    found = []
    for row in rows:
        if row.bound == "DEFAULT":
            found.append(Partition(row.name, None, None))
        else:
            found.append(Partition(row.name, row.start, row.end))
    return found


def _set_lock_timeout(connection: Connection, seconds: float) -> None:
    connection.execute(text("SELECT set_config('lock_timeout', :value, true)"), {"value": f"{int(seconds * 1000)}ms"})


def _log_lock_not_granted(table: PartitionTable, partition: Partition, action: str, lock_timeout: float) -> None:
    outbox = table.outbox.__outbox__.job_name
    logger.info(
        "%s: partition %s not %s: the table's lock was not granted within %g s; the next run tries again",
        outbox, partition.name, action, lock_timeout,
        extra=log_fields("retention.partition_lock_not_granted", outbox, partition=partition.name),
    )


def overlaps(wanted: Partition, existing: Sequence[Partition]) -> bool:
    """Whether a range partition among ``existing`` covers part of ``wanted``'s range."""
    for partition in existing:
        if partition.is_default:
            continue
        starts_before_end = partition.start is None or wanted.end is None or partition.start < wanted.end
        ends_after_start = partition.end is None or wanted.start is None or partition.end > wanted.start
        if starts_before_end and ends_after_start:
            return True
    return False


def create_partition(
    engine: Engine, table: PartitionTable, wanted: Partition, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
) -> int | None:
    """Create ``wanted`` (its rows moved in from the DEFAULT partition); return how many rows moved.

    None when it was not created: a partition overlapping its range exists
    (made by another process, or a converted table's first partition), or
    the parent's lock was not granted within ``lock_timeout`` (the next run
    tries again).
    """
    assert wanted.start is not None and wanted.end is not None
    bounds = {"start": wanted.start, "end": wanted.end}
    quoted = table.quoted(wanted.name)
    with engine.connect() as connection:
        try:
            with connection.begin():
                _set_lock_timeout(connection, lock_timeout)
                connection.execute(text(f"LOCK TABLE {table.parent} IN SHARE ROW EXCLUSIVE MODE"))
                if overlaps(wanted, partitions(connection, table)):
                    return None
                connection.execute(text(
                    f"CREATE TABLE {quoted} (LIKE {table.parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                    f"WITH ({storage_parameters_sql()})"
                ))
                moved = 0
                if any(partition.is_default for partition in partitions(connection, table)):
                    moved = connection.execute(
                        text(
                            f"WITH moved AS (DELETE FROM {table.default} WHERE created_at >= :start AND created_at < :end "
                            f"RETURNING {table.column_list}) "
                            f"INSERT INTO {quoted} ({table.column_list}) SELECT {table.column_list} FROM moved"
                        ),
                        bounds,
                    ).rowcount
                connection.execute(text(
                    f"ALTER TABLE {table.parent} ATTACH PARTITION {quoted} "
                    f"FOR VALUES FROM ({timestamp_literal(wanted.start)}) TO ({timestamp_literal(wanted.end)})"
                ))
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available: try again next run
                raise
            _log_lock_not_granted(table, wanted, "created", lock_timeout)
            return None
    return moved


_UNFINISHED = (
    "SELECT EXISTS (SELECT 1 FROM {partition} WHERE status = 'pending') "
    "OR EXISTS (SELECT 1 FROM {partition} WHERE status = 'stuck')"
)


def drop_partition_if_done(
    engine: Engine, table: PartitionTable, partition: Partition, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
) -> bool | None:
    """Detach and drop ``partition`` if every row in it is ``done``: True if dropped, False if a row is not
    done (the partition and all its rows stay), None if the table's lock was not granted in time."""
    if partition.is_default:
        raise ValueError("the DEFAULT partition is never dropped")
    quoted = table.quoted(partition.name)
    with engine.connect() as connection:
        try:
            with connection.begin() as transaction:
                _set_lock_timeout(connection, lock_timeout)
                connection.execute(text(f"LOCK TABLE {table.parent} IN ACCESS EXCLUSIVE MODE"))
                if partition.name not in {found.name for found in partitions(connection, table)}:
                    transaction.rollback()
                    return None
                if connection.execute(text(_UNFINISHED.format(partition=quoted))).scalar_one():
                    transaction.rollback()
                    return False
                connection.execute(text(f"ALTER TABLE {table.parent} DETACH PARTITION {quoted}"))
                connection.execute(text(f"DROP TABLE {quoted}"))
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":
                raise
            _log_lock_not_granted(table, partition, "dropped", lock_timeout)
            return None
    return True
