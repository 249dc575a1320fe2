"""Migration helpers for partitioned outboxes: create one, convert a plain one online, tune a plain one's storage.

``create_partitioned_outbox(OrderOutbox)`` runs, in a revision's ``upgrade()``, what autogenerate cannot
write: the table partitioned by range of ``created_at`` (the model's own DDL), its indexes, its DEFAULT
partition and the partitions of the current interval and the ``partitions_ahead`` after it, each with the
kit's storage settings.  Downgrade with ``op.drop_table(...)``, which drops the partitions too.

``convert_to_partitioned(OrderOutbox)`` turns an existing plain outbox table, whose class now declares
``partition_by``, into a partitioned one without rewriting a row and with the table locked only for a
catalog swap.  Its existing rows become the first partition, ``<table>_pbefore``, holding every
``created_at`` before the *cutover*, the start of the interval after next (one to two days ahead for
daily partitions); new partitions start there.  The steps, and why each is online:

1. in AUTOCOMMIT: the storage settings; a unique index on ``(id, created_at)`` and one on
   ``(idempotency_key, created_at)`` built ``CONCURRENTLY`` (writes go on); a ``CHECK (created_at <
   cutover)`` added ``NOT VALID`` and then validated (a scan that takes no lock writers wait on);
2. one short transaction, under ``lock_timeout`` (default 5 s): the table locked, renamed to
   ``<table>_pbefore``, its primary key and idempotency constraint swapped to the new indexes (no index
   is built), its indexes renamed out of the way, the partitioned table created under the old name with
   the model's indexes, the old table attached as its first partition (the validated CHECK spares the
   scan, and each of the model's indexes matches one the table has), the id sequence carried over, the
   DEFAULT partition and the partitions from the cutover created;
3. the CHECK dropped (the partition's bound now says the same).

If step 2 fails (the lock was not granted, the cutover has passed), it is rolled back whole and the
CHECK and the two indexes of step 1 are dropped again, so the table is as it was.  The table must match
its model before the conversion (the model's indexes present, as autogenerate leaves it): an index of
the model the old table lacks would be built inside step 2, under the lock.  Reinstall the NOTIFY
trigger afterwards (``install_notify_triggers``): a trigger on the old table does not fire for inserts
into the new one.  In offline mode (``--sql``) the steps are printed in order, without the clean-up.

``set_outbox_storage(OrderOutbox)`` sets the kit's autovacuum settings on plain outbox
tables (``outboxkit.storage.partitions.OUTBOX_STORAGE_PARAMETERS``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from alembic.operations import Operations
from sqlalchemy import Table
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from outboxkit.errors import ConfigurationError
from outboxkit.migrations.revision_ops import checked_outboxes, execute_all, migration_operations
from outboxkit.model import PARTITION_INTERVALS, Outbox
from outboxkit.storage.drain_queries import quote_table
from outboxkit.storage.partitions import (
    PartitionTable,
    interval_start,
    storage_parameters_sql,
    timestamp_literal,
    wanted_ranges,
)

__all__ = [
    "CONVERSION_LOCK_TIMEOUT_SECONDS",
    "conversion_cutover",
    "convert_to_partitioned",
    "create_partitioned_outbox",
    "create_partitioned_outbox_sql",
    "set_outbox_storage",
]

CONVERSION_LOCK_TIMEOUT_SECONDS = 5.0


def _partitioned_table(outbox: type[Outbox]) -> PartitionTable:
    (outbox,) = checked_outboxes((outbox,))
    if outbox.__outbox__.partition_by is None:
        raise ConfigurationError(
            f"{outbox.__name__} is not partitioned: declare OutboxOptions(..., partition_by='day' or 'week') first"
        )
    return PartitionTable(outbox)


def _parent_ddl(outbox: type[Outbox]) -> list[str]:
    """The model's own CREATE TABLE (``PARTITION BY RANGE (created_at)``) and CREATE INDEX statements."""
    table: Table = outbox.__table__  # type: ignore[attr-defined]
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    statements = [str(CreateTable(table).compile(dialect=dialect)).strip()]
    statements += [str(CreateIndex(index).compile(dialect=dialect)).strip() for index in sorted(table.indexes, key=str)]
    return statements


def _ranges_sql(table: PartitionTable, starts_at: datetime, outbox: type[Outbox]) -> list[str]:
    statements = [
        f"CREATE TABLE IF NOT EXISTS {table.default} PARTITION OF {table.parent} DEFAULT WITH ({storage_parameters_sql()})"
    ]
    for wanted in wanted_ranges(outbox, starts_at):
        assert wanted.start is not None and wanted.end is not None
        statements.append(
            f"CREATE TABLE {table.quoted(wanted.name)} PARTITION OF {table.parent} "
            f"FOR VALUES FROM ({timestamp_literal(wanted.start)}) TO ({timestamp_literal(wanted.end)}) "
            f"WITH ({storage_parameters_sql()})"
        )
    return statements


def create_partitioned_outbox_sql(outbox: type[Outbox], *, now: datetime | None = None) -> list[str]:
    """The statements ``create_partitioned_outbox`` runs, in order."""
    table = _partitioned_table(outbox)
    return [*_parent_ddl(outbox), *_ranges_sql(table, now or datetime.now(timezone.utc), outbox)]


def create_partitioned_outbox(
    outbox: type[Outbox], *, operations: Operations | None = None, now: datetime | None = None
) -> None:
    """In a revision's ``upgrade()``: create ``outbox``'s partitioned table with its DEFAULT partition and the
    partitions of the current interval and ``partitions_ahead`` after it (``now`` defaults to the clock)."""
    execute_all(operations, create_partitioned_outbox_sql(outbox, now=now))


def set_outbox_storage(*outboxes: type[Outbox], operations: Operations | None = None) -> None:
    """In a revision's ``upgrade()``: the kit's autovacuum settings on plain outbox tables.

    Applies to the next autovacuum decisions; nothing is rewritten.  A partitioned
    outbox's partitions get them when they are created.
    """
    statements = []
    for outbox in checked_outboxes(outboxes):
        if outbox.__outbox__.partition_by is not None:
            raise ConfigurationError(
                f"{outbox.__name__} is partitioned: its partitions get the storage settings when they are created"
            )
        reference = quote_table(outbox.__table__)  # type: ignore[attr-defined]
        statements.append(f"ALTER TABLE {reference} SET ({storage_parameters_sql()})")
    execute_all(operations, statements)


def conversion_cutover(outbox: type[Outbox], now: datetime) -> datetime:
    """Where the converted table's first partition ends: the start of the interval after the next."""
    interval = outbox.__outbox__.partition_by
    assert interval is not None
    return interval_start(now, interval) + timedelta(days=2 * PARTITION_INTERVALS[interval])


def convert_to_partitioned(
    outbox: type[Outbox],
    *,
    operations: Operations | None = None,
    now: datetime | None = None,
    lock_timeout: float = CONVERSION_LOCK_TIMEOUT_SECONDS,
) -> None:
    """In a revision's ``upgrade()``: turn ``outbox``'s existing plain table into a partitioned one, online.

    The module's docstring lists the steps.  ``now`` (default: the clock)
    decides the cutover.  Raises, with the table left as it was, when the
    swap's lock is not granted within ``lock_timeout`` seconds.
    """
    table = _partitioned_table(outbox)
    cutover = conversion_cutover(outbox, now or datetime.now(timezone.utc))
    legacy = f"{table.name}_pbefore"
    prefix = table.name[:40]
    names = {
        "ids": f"{prefix}_conv_id_created",
        "keys": f"{prefix}_conv_key_created",
        "check": f"{prefix}_conv_before_cutover",
    }
    operations = migration_operations(operations)
    prepare = [
        f"ALTER TABLE {table.parent} SET ({storage_parameters_sql()})",
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {table.quoted(names['ids'])} ON {table.parent} (id, created_at)",
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {table.quoted(names['keys'])} "
        f"ON {table.parent} (idempotency_key, created_at)",
        f"ALTER TABLE {table.parent} ADD CONSTRAINT {table.quoted(names['check'])} "
        f"CHECK (created_at < {timestamp_literal(cutover)}) NOT VALID",
        f"ALTER TABLE {table.parent} VALIDATE CONSTRAINT {table.quoted(names['check'])}",
    ]
    undo = [
        f"ALTER TABLE {table.parent} DROP CONSTRAINT IF EXISTS {table.quoted(names['check'])}",
        f"DROP INDEX CONCURRENTLY IF EXISTS {table.quoted(names['ids'])}",
        f"DROP INDEX CONCURRENTLY IF EXISTS {table.quoted(names['keys'])}",
    ]
    swap = _swap_sql(table, outbox, legacy=legacy, names=names, cutover=cutover, lock_timeout=lock_timeout)
    context = operations.get_context()
    with context.autocommit_block():
        execute_all(operations, prepare)
        if context.as_sql:
            execute_all(operations, ["BEGIN", *swap, "COMMIT"])
            return
        # The swap is one transaction of its own, on the driver's connection (in AUTOCOMMIT here), so that a
        # failure can be rolled back and step 1 undone before the error goes on.
        driver = operations.get_bind().connection.driver_connection
        assert driver is not None  # a live connection: offline mode returned above
        try:
            with driver.transaction(), driver.cursor() as cursor:
                for statement in swap:
                    cursor.execute(statement)
        except BaseException:
            with driver.cursor() as cursor:
                for statement in undo:
                    cursor.execute(statement)
            raise


def _swap_sql(
    table: PartitionTable, outbox: type[Outbox], *, legacy: str, names: dict[str, str], cutover: datetime,
    lock_timeout: float,
) -> list[str]:
    quoted_legacy = table.quoted(legacy)
    legacy_literal = "'" + table.regclass(legacy).replace("'", "''") + "'"
    prefix = legacy[:48]
    return [
        f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'",
        f"LOCK TABLE {table.parent} IN ACCESS EXCLUSIVE MODE",
        f"""DO $$ BEGIN
    IF statement_timestamp() >= {timestamp_literal(cutover)}::timestamptz THEN
        RAISE EXCEPTION 'outboxkit: the conversion''s cutover % has passed; run it again', {timestamp_literal(cutover)};
    END IF;
END $$""",
        f"ALTER TABLE {table.parent} RENAME TO {table.quoted(legacy)}",
        # The primary key and the idempotency key's unique constraint move to the indexes built in step 1,
        # then every index of the old table gets a name of its own, freeing the model's names.
        f"""DO $$
DECLARE
    legacy regclass := {legacy_literal}::regclass;
    found record;
    counter integer := 0;
BEGIN
    FOR found IN SELECT conname FROM pg_constraint WHERE conrelid = legacy AND (contype = 'p' OR (contype = 'u'
                 AND conkey = ARRAY[(SELECT attnum FROM pg_attribute WHERE attrelid = legacy AND attname = 'idempotency_key')]))
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', legacy, found.conname);
    END LOOP;
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I', legacy, '{prefix}_pkey', '{names["ids"]}');
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I UNIQUE USING INDEX %I', legacy, '{prefix}_key', '{names["keys"]}');
    FOR found IN SELECT indexrelid::regclass AS name FROM pg_index WHERE indrelid = legacy
                 AND indexrelid NOT IN (SELECT conindid FROM pg_constraint WHERE conrelid = legacy) ORDER BY 1 LOOP
        counter := counter + 1;
        EXECUTE format('ALTER INDEX %s RENAME TO %I', found.name, '{prefix}_ix' || counter);
    END LOOP;
END $$""",
        f"ALTER TABLE {quoted_legacy} ALTER COLUMN id DROP IDENTITY IF EXISTS",
        *_parent_ddl(outbox),
        f"ALTER TABLE {table.parent} ATTACH PARTITION {quoted_legacy} "
        f"FOR VALUES FROM (MINVALUE) TO ({timestamp_literal(cutover)})",
        f"ALTER TABLE {quoted_legacy} DROP CONSTRAINT {table.quoted(names['check'])}",
        f"SELECT setval(pg_get_serial_sequence('{table.regclass(table.name)}', 'id'), "
        f"(SELECT coalesce(max(id), 0) FROM {table.parent}) + 1, false)",
        *_ranges_sql(table, cutover, outbox),
    ]
