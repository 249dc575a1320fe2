"""Helpers for an application's own Alembic environment.

The kit's tables (``outboxkit_job_runs``, ``outboxkit_reset_audit``,
``outboxkit_attempts``, ``outboxkit_outbox_minutes``,
``outboxkit_outbox_pauses``, ``outboxkit_destinations``, ``outboxkit_ordering_skips``,
``outboxkit_destination_rates``, ``outboxkit_schedules``,
``outboxkit_schedule_leases``, ``outboxkit_schedule_audit``, ``outboxkit_secrets``,
``outboxkit_inbox``, ``outboxkit_inbox_sources``, the events' ``outboxkit_subscriptions``,
``outboxkit_subscription_audit``, ``outboxkit_events``, ``outboxkit_event_types`` and the deliveries outbox
``outboxkit_event_deliveries``) belong to the
kit's migration branch, not to the application's models, so an autogenerate
over the application's metadata would propose dropping them.
Pass ``include_name`` (or ``include_object``) to ``context.configure`` in
``env.py`` and autogenerate leaves them alone::

    from outboxkit.migrations.helpers import include_name

    context.configure(connection=connection, target_metadata=Base.metadata, include_name=include_name)

Autogenerate does not see triggers.  The NOTIFY trigger that wakes the drain
on insert goes into a revision of the application's own::

    from outboxkit.migrations.helpers import drop_notify_triggers, install_notify_triggers

    def upgrade() -> None:
        install_notify_triggers(OrderOutbox)

    def downgrade() -> None:
        drop_notify_triggers(OrderOutbox)

The statements are those of ``outboxkit.storage.notify.install_trigger_sql`` and
``drop_trigger_sql``; both functions also work in offline mode
(``alembic upgrade heads --sql``), where they print the SQL.  An insert
notifies only when no wake-up of its outbox is pending
(``outboxkit.storage.wakeups``, table ``outboxkit_wakeups`` from the kit's
``outboxkit_0018``).  Triggers installed by an older version notify on every
insert: a revision of the application's that runs ``install_notify_triggers``
again, after ``outboxkit_0018``, replaces their functions.

Each row carries its ``destination``, decided when it is inserted.  A table
made before the column existed gets it from autogenerate (the column and the
index ``ix_<table>_destination_due``); ``backfill_destinations`` then fills it
in for the rows still to be sent, after the column exists::

    def upgrade() -> None:
        op.add_column("order_outbox", sa.Column("destination", sa.String(300), nullable=True))
        op.create_index("ix_order_outbox_destination_due", "order_outbox", ["destination", "next_attempt_at", "id"],
                        postgresql_where=sa.text("status = 'pending'"))
        backfill_destinations(OrderOutbox)

A pending row left without one (offline mode, or its ``build_delivery``
raises) is still delivered: the drain decides its destination after the
claim, as it did before the column existed.
docs/getting-started.md walks through the whole recipe, from
``alembic init`` to the first revision.

A partitioned outbox (``OutboxOptions(partition_by="day")``) is created by
``create_partitioned_outbox`` rather than autogenerate's ``create_table``:
the table partitioned by ``created_at``, its indexes, its DEFAULT partition
and the partitions of the next intervals, each with the kit's storage
settings.  An existing plain outbox becomes partitioned with
``convert_to_partitioned``, online: its rows stay where they are, as the
first partition.  ``set_outbox_storage`` gives a plain outbox table the same
autovacuum settings (``outboxkit.storage.partitions``)::

    def upgrade() -> None:
        create_partitioned_outbox(OrderOutbox)
        install_notify_triggers(OrderOutbox)

docs/partitioning.md has the whole story.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from alembic.operations import Operations
from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.orm import Session

from outboxkit.migrations.partitioned_tables import (
    convert_to_partitioned,
    create_partitioned_outbox,
    set_outbox_storage,
)
from outboxkit.migrations.revision_ops import checked_outboxes, execute_all, migration_operations
from outboxkit.model import STATUSES, Outbox
from outboxkit.storage.notify import drop_trigger_sql, install_trigger_sql
from outboxkit.storage.tables import kit_metadata

__all__ = [
    "KIT_TABLES", "allow_discarded", "backfill_destinations", "convert_to_partitioned", "create_partitioned_outbox",
    "drop_notify_triggers", "forbid_discarded", "include_name", "include_object", "install_notify_triggers",
    "set_outbox_storage",
]

# Rows read and written per round of backfill_destinations.
BACKFILL_BATCH = 1000

KIT_TABLES: frozenset[str] = frozenset(table.name for table in kit_metadata.tables.values())
"""The tables the kit's own migration branch owns."""


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """``include_name`` for ``context.configure``: autogenerate does not reflect the kit's tables.

    Combine it with a filter of your own with ``and``::

        include_name=lambda *args: include_name(*args) and my_filter(*args)
    """
    # A table left out here is never reflected, so its columns and indexes are not compared either.
    return not (type_ == "table" and name in KIT_TABLES)


def include_object(object_: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """``include_object`` for ``context.configure``: autogenerate neither creates nor drops the kit's tables.

    ``include_name`` already keeps them out of reflection; this also covers
    an environment whose ``target_metadata`` lists ``kit_metadata``.
    """
    if type_ == "table":
        return name not in KIT_TABLES
    table = getattr(object_, "table", None)
    return getattr(table, "name", None) not in KIT_TABLES


def install_notify_triggers(*outboxes: type[Outbox], operations: Operations | None = None) -> None:
    """In a revision's ``upgrade()``: make inserts into each outbox wake its drain (NOTIFY, only when no wake-up
    is pending: ``outboxkit.storage.wakeups``).

    Re-running it is harmless (the function is replaced, the trigger dropped
    and created again), and upgrades a trigger installed by an older version.
    ``operations`` defaults to Alembic's ``op``.
    """
    execute_all(operations, (statement for outbox in checked_outboxes(outboxes) for statement in install_trigger_sql(outbox)))


def drop_notify_triggers(*outboxes: type[Outbox], operations: Operations | None = None) -> None:
    """In a revision's ``downgrade()``: undo ``install_notify_triggers`` for the same outboxes."""
    execute_all(operations, (statement for outbox in checked_outboxes(outboxes) for statement in drop_trigger_sql(outbox)))


def allow_discarded(*outboxes: type[Outbox], operations: Operations | None = None) -> None:
    """In a revision's ``upgrade()``: let each outbox table's ``status`` CHECK take ``discarded``, and build the
    index ``ix_<table>_discarded`` that counts and lists those rows.

    Tables created before the status existed refuse a discard with a CHECK violation until this runs
    (autogenerate does not compare CHECK constraints).  The CHECK is dropped and created again with
    every status of ``outboxkit.model.STATUSES``, under the mixin's name ``ck_<table>_status``; the
    index is built ``CONCURRENTLY`` in an autocommit block, so a big outbox keeps taking inserts.
    """
    outboxes = checked_outboxes(outboxes)
    execute_all(operations, (statement for outbox in outboxes for statement in _status_check(outbox, STATUSES)))
    with migration_operations(operations).get_context().autocommit_block():
        execute_all(operations, (_discarded_index(outbox, "CREATE INDEX CONCURRENTLY IF NOT EXISTS") for outbox in outboxes))


def forbid_discarded(*outboxes: type[Outbox], operations: Operations | None = None) -> None:
    """In a revision's ``downgrade()``: undo ``allow_discarded``; refused by PostgreSQL while a row is discarded."""
    before = tuple(status for status in STATUSES if status != "discarded")
    outboxes = checked_outboxes(outboxes)
    execute_all(operations, (statement for outbox in outboxes for statement in _status_check(outbox, before)))
    execute_all(
        operations, (f"DROP INDEX IF EXISTS {_qualified(outbox, f'ix_{_table(outbox)}_discarded')}" for outbox in outboxes)
    )


def _table(outbox: type[Outbox]) -> str:
    return str(outbox.__table__.name)  # type: ignore[attr-defined]


def _qualified(outbox: type[Outbox], name: str) -> str:
    schema = outbox.__table__.schema  # type: ignore[attr-defined]
    return f"{schema}.{name}" if schema else name


def _discarded_index(outbox: type[Outbox], create: str) -> str:
    table = _table(outbox)
    return f"{create} ix_{table}_discarded ON {_qualified(outbox, table)} (id) WHERE status = 'discarded'"


def _status_check(outbox: type[Outbox], statuses: tuple[str, ...]) -> list[str]:
    table, name = _table(outbox), _qualified(outbox, _table(outbox))
    allowed = ", ".join(f"'{status}'" for status in statuses)
    return [
        f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS ck_{table}_status",
        f"ALTER TABLE {name} ADD CONSTRAINT ck_{table}_status CHECK (status IN ({allowed}))",
    ]


def backfill_destinations(
    *outboxes: type[Outbox], operations: Operations | None = None, batch_size: int = BACKFILL_BATCH
) -> int:
    """In a revision's ``upgrade()``, after the column exists: each pending row's destination, as an insert now
    would decide it (``Outbox.destination_for``); returns how many rows got one.

    Rows are read and written ``batch_size`` at a time, in ``id`` order, on
    the migration's connection.  In offline mode (``--sql``) it writes
    nothing: the destination comes from the application's Python code, not
    SQL, and the drain decides it for rows left without one.
    """
    operations = migration_operations(operations)
    if operations.get_context().as_sql:
        operations.execute("-- outboxkit: backfill_destinations needs a live connection; rows without one are "
                           "decided by the drain")
        return 0
    connection = operations.get_bind()
    return sum(_backfill(connection, outbox, batch_size) for outbox in checked_outboxes(outboxes))


def _backfill(connection: Connection, outbox: type[Outbox], batch_size: int) -> int:
    table = outbox.__table__  # type: ignore[attr-defined]
    write = (
        update(table)
        .where(table.c.id == bindparam("row_id"), table.c.destination.is_(None))
        .values(destination=bindparam("decided"))
    )
    after, written = 0, 0
    with Session(connection, autoflush=False) as session:
        while True:
            rows = session.scalars(
                select(outbox)
                .where(outbox.status == "pending", outbox.destination.is_(None), outbox.id > after)
                .order_by(outbox.id)
                .limit(batch_size)
            ).all()
            if not rows:
                return written
            after = rows[-1].id
            decided = [{"row_id": row.id, "decided": name} for row in rows if (name := row._decide_destination())]
            if decided:
                connection.execute(write, decided)
                written += len(decided)
            session.expunge_all()
