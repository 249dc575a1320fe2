"""The enqueue fast path: outbox rows inserted through SQLAlchemy Core, in the caller's transaction.

::

    with Session(engine) as session, session.begin():
        session.add(grant)
        enqueue(session, CreditGrantOutbox, {"workspace": grant.workspace, "amount": grant.amount})

    with engine.begin() as connection:                      # a Core connection works too
        enqueue_many(connection, CreditGrantOutbox, [{"workspace": w, "amount": 5} for w in workspaces])

Both write the rows on the caller's connection, inside the caller's
transaction: the rows exist when that transaction commits and not before, and
a rollback leaves none behind.  ``session.add(CreditGrantOutbox(...))`` (the
ORM path) stays and writes the same rows; this path skips building ORM
objects and the unit of work, which is most of an ORM insert's client CPU.

What a row gets is what the ORM path gives it:

* the columns' Python defaults (``idempotency_key`` is a fresh ``uuid4``,
  ``status`` ``'pending'``, ``attempts`` 0, the application's own
  ``default=``), and the server defaults for the rest (``next_attempt_at``,
  ``created_at`` and ``updated_at`` are the transaction's ``now()``);
* its ``destination`` (``Outbox.destination_for``), decided from the
  values given, as the ORM decides it from the instance;
* an application may set its own columns, ``idempotency_key`` (a
  ``uuid.UUID``) and ``next_attempt_at`` (an aware datetime: a scheduled
  one-shot send); the delivery state (``status``, ``attempts``, the lease,
  the last error, the timestamps) is the kit's and is refused.

Every row is checked before anything is written: a column the table does not
have, a kit column, a missing required column, ``None`` in a NOT NULL column,
a key that is not a UUID or a naive due time raises ``InvalidValueError`` or
``InvalidTypeError`` naming the row and the column, and nothing is sent to
the database.

NOTIFY: the insert trigger (``outboxkit.storage.notify.install_trigger_sql``) fires
for these inserts as for any other, COPY included, once per statement, and
notifies when the caller commits unless a wake-up is pending already
(``outboxkit.storage.wakeups``).  Without the trigger, pass ``notify=True``: the
same ``pg_notify`` the trigger sends runs in the caller's transaction, so a
rollback sends nothing.  (PostgreSQL folds identical notifications of one
transaction into one, so ``notify=True`` with the trigger installed is
harmless.)

Large batches: ``enqueue_many`` writes ``copy_threshold`` rows or more (default
``COPY_THRESHOLD``) with ``COPY ... FROM STDIN`` on the caller's psycopg 3
connection, still in its transaction, and fewer with one executemany INSERT.
Both write the same rows.  COPY needs a sync psycopg 3 connection: on any
other driver, or when an omitted column has a SQL-expression ``default=``
that only an INSERT can evaluate, the INSERT is used.

An async application awaits ``enqueue_async(session, CreditGrantOutbox, {...})``
with its ``AsyncSession`` (or ``AsyncConnection``): the same row, inserted on
the session's own async connection on the event loop, with no thread between.
For a batch, ``await session.run_sync(lambda session: enqueue_many(session, ...))``
(a greenlet on the same thread, not a thread either).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection, Dialect, Insert, Table, insert
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidTypeError, InvalidValueError
from outboxkit.model import KIT_COLUMNS, Outbox, destination_of_values
from outboxkit.storage.notify import notify_statement

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

__all__ = ["COPY_THRESHOLD", "enqueue", "enqueue_async", "enqueue_many"]

# From this many rows on, enqueue_many writes with COPY: below it an
# executemany INSERT is as fast (bench/enqueue.py).
COPY_THRESHOLD = 200

# The columns an enqueue may set besides the application's own.
SETTABLE_KIT_COLUMNS = frozenset({"idempotency_key", "next_attempt_at"})


def enqueue(target: Session | Connection, outbox: type[Outbox], values: Mapping[str, Any], *, notify: bool = False) -> uuid.UUID:
    """Insert one row into ``outbox`` in ``target``'s transaction; return its idempotency key.

    ``target`` is the caller's ``Session`` or ``Connection``; ``values`` maps
    column names to values (the application's columns, and optionally
    ``idempotency_key`` and ``next_attempt_at``).  See the module docstring
    for the defaults, the checks and ``notify``.
    """
    plan = _plan_for(outbox)
    row = plan.complete(values, position=None)
    connection = _connection_of(target, outbox)
    connection.execute(plan.statement, row)
    if notify:
        connection.execute(notify_statement(outbox))
    return row["idempotency_key"]  # type: ignore[no-any-return]


async def enqueue_async(
    target: AsyncSession | AsyncConnection, outbox: type[Outbox], values: Mapping[str, Any], *, notify: bool = False
) -> uuid.UUID:
    """``enqueue`` for an async application: one row in the ``AsyncSession``'s (or ``AsyncConnection``'s) transaction.

    The insert is awaited on the caller's event loop, on the session's own
    async connection (psycopg's or asyncpg's): no thread and no ``run_sync``.
    The row, its checks and ``notify`` are those of ``enqueue``.
    """
    plan = _plan_for(outbox)
    row = plan.complete(values, position=None)
    connection = await _async_connection_of(target, outbox)
    await connection.execute(plan.statement, row)
    if notify:
        await connection.execute(notify_statement(outbox))
    return row["idempotency_key"]  # type: ignore[no-any-return]


def enqueue_many(
    target: Session | Connection,
    outbox: type[Outbox],
    rows: Iterable[Mapping[str, Any]],
    *,
    notify: bool = False,
    copy_threshold: int = COPY_THRESHOLD,
) -> list[uuid.UUID]:
    """Insert many rows into ``outbox`` in ``target``'s transaction; return their idempotency keys in order.

    Every row is checked before the first is written.  ``copy_threshold``
    rows or more go through COPY (see the module docstring).  An empty
    ``rows`` writes nothing and sends no NOTIFY.
    """
    if isinstance(copy_threshold, bool) or not isinstance(copy_threshold, int) or copy_threshold < 1:
        raise InvalidValueError(f"copy_threshold must be a positive integer, got {copy_threshold!r}")
    if isinstance(rows, Mapping) or isinstance(rows, (str, bytes)):
        raise InvalidTypeError("enqueue_many takes an iterable of rows (mappings); for one row call enqueue()")
    plan = _plan_for(outbox)
    completed = [plan.complete(values, position=position) for position, values in enumerate(rows)]
    if not completed:
        return []
    connection = _connection_of(target, outbox)
    for run in _runs_of_same_columns(completed):
        if len(run) >= copy_threshold and plan.can_copy(run[0].keys()):
            driver_connection = connection.connection.driver_connection
            if isinstance(driver_connection, psycopg.Connection):
                plan.copy(driver_connection, connection.dialect, run)
                continue
        connection.execute(plan.statement, run)
    if notify:
        connection.execute(notify_statement(outbox))
    return [row["idempotency_key"] for row in completed]


def _connection_of(target: Session | Connection, outbox: type[Outbox]) -> Connection:
    if isinstance(target, Session):
        # The outbox's own bind, for a session that binds tables to several engines.
        return target.connection(bind_arguments={"mapper": outbox})
    if isinstance(target, Connection):
        return target
    raise InvalidTypeError(
        f"enqueue needs the caller's sqlalchemy Session or Connection, got {type(target).__name__}; "
        "from an AsyncSession, await enqueue_async(session, ...)"
    )


async def _async_connection_of(target: AsyncSession | AsyncConnection, outbox: type[Outbox]) -> AsyncConnection:
    # Imported here: sqlalchemy.ext.asyncio needs greenlet, which a sync application may not have.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(target, AsyncSession):
        return await target.connection(bind_arguments={"mapper": outbox})
    if isinstance(target, AsyncConnection):
        return target
    raise InvalidTypeError(
        f"enqueue_async needs the caller's AsyncSession or AsyncConnection, got {type(target).__name__}; "
        "with a sync Session or Connection call enqueue()"
    )


def _runs_of_same_columns(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive rows that set the same columns, in order: one statement each keeps the ids in row order."""
    runs: list[list[dict[str, Any]]] = []
    for row in rows:
        if runs and runs[-1][0].keys() == row.keys():
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


@dataclass(frozen=True)
class _Plan:
    """What one outbox table needs from an enqueue, worked out once per class."""

    outbox_name: str
    outbox: type[Outbox]
    table: Table
    statement: Insert
    settable: frozenset[str]
    required: frozenset[str]
    not_null: frozenset[str]
    # Python-side defaults filled in by the enqueue itself: a value, or a callable of no argument.
    defaults: tuple[tuple[str, Any, bool], ...]
    expression_defaults: frozenset[str]

    def complete(self, values: Mapping[str, Any], *, position: int | None) -> dict[str, Any]:
        """The row to write: ``values`` checked, with the Python defaults of the columns it leaves out."""
        where = f"{self.outbox_name}" if position is None else f"{self.outbox_name} row {position}"
        if not isinstance(values, Mapping):
            raise InvalidTypeError(f"{where}: a row is a mapping of column names to values, got {type(values).__name__}")
        row = dict(values)
        unknown = [name for name in row if name not in self.settable]
        if unknown:
            raise InvalidValueError(f"{where}: {self._refusal(unknown)}")
        for name in self.required:
            if name not in row:
                raise InvalidValueError(f"{where}: column {name!r} is required (NOT NULL, no default)")
        for name, value in row.items():
            if value is None and name in self.not_null:
                raise InvalidValueError(f"{where}: column {name!r} is NOT NULL, got None")
        key = row.get("idempotency_key")
        if key is not None and not isinstance(key, uuid.UUID):
            raise InvalidTypeError(f"{where}: idempotency_key must be a uuid.UUID, got {type(key).__name__}")
        due = row.get("next_attempt_at")
        if due is not None and (not isinstance(due, datetime) or due.utcoffset() is None):
            raise InvalidValueError(f"{where}: next_attempt_at must be an aware datetime (with a timezone), got {due!r}")
        for name, default, is_callable in self.defaults:
            if name not in row:
                row[name] = default() if is_callable else default
        row["destination"] = destination_of_values(self.outbox, row)
        return row

    def _refusal(self, names: list[str]) -> str:
        kit_owned = sorted(name for name in names if name in self.table.columns)
        if kit_owned:
            return (
                f"column(s) {', '.join(map(repr, kit_owned))} belong to the kit's delivery state; a new row is "
                f"pending with 0 attempts (set only your own columns, idempotency_key and next_attempt_at)"
            )
        return (
            f"no column(s) {', '.join(map(repr, sorted(names)))} in {self.table.name}; "
            f"the columns an enqueue may set: {', '.join(sorted(self.settable))}"
        )

    def can_copy(self, columns: Iterable[str]) -> bool:
        """COPY cannot evaluate a SQL-expression default: rows that leave out such a column go through INSERT."""
        return not (self.expression_defaults - set(columns))

    def copy(self, connection: psycopg.Connection[Any], dialect: Dialect, rows: Sequence[dict[str, Any]]) -> None:
        """``COPY <table> (<columns>) FROM STDIN`` on the caller's connection, in its open transaction.

        Each value goes through its column type's bind processing (JSON, a
        ``TypeDecorator``...) as an INSERT on that connection would send it.
        """
        names = list(rows[0])
        processors = [self.table.columns[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names]
        table = sql.Identifier(self.table.schema, self.table.name) if self.table.schema else sql.Identifier(self.table.name)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(", ").join(map(sql.Identifier, names)))
        with connection.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                values = [row[name] for name in names]
                copy.write_row([value if bind is None else bind(value) for bind, value in zip(processors, values, strict=True)])


_PLANS: dict[type[Outbox], _Plan] = {}


def _plan_for(outbox: type[Outbox]) -> _Plan:
    """The plan of ``outbox``, worked out on its first enqueue."""
    try:
        return _PLANS[outbox]
    except (KeyError, TypeError):  # TypeError: not even hashable, refused by the checks below
        plan = _build_plan(outbox)
    return _PLANS.setdefault(outbox, plan)


def _build_plan(outbox: type[Outbox]) -> _Plan:
    table = getattr(outbox, "__table__", None)
    if not (isinstance(outbox, type) and issubclass(outbox, Outbox) and isinstance(table, Table)):
        raise InvalidTypeError(f"enqueue needs a mapped Outbox subclass, got {outbox!r}")
    kit_columns = KIT_COLUMNS
    settable = frozenset(name for name in table.columns.keys() if name not in kit_columns) | SETTABLE_KIT_COLUMNS
    defaults: list[tuple[str, Any, bool]] = []
    expression_defaults: set[str] = set()
    required: set[str] = set()
    not_null: set[str] = set()
    for column in table.columns:
        default = column.default
        if column.key == "destination":  # decided per row from its values (_Plan.complete)
            continue
        if default is not None and getattr(default, "is_scalar", False):
            defaults.append((column.key, default.arg, False))
        elif default is not None and getattr(default, "is_callable", False):
            function = default.arg
            defaults.append((column.key, lambda function=function: function(None), True))
        elif default is not None:
            expression_defaults.add(column.key)
        if column.key in settable and not column.nullable:
            not_null.add(column.key)
            if default is None and column.server_default is None and column.identity is None:
                required.add(column.key)
    return _Plan(
        outbox_name=outbox.__name__,
        outbox=outbox,
        table=table,
        statement=insert(table),
        settable=settable,
        required=frozenset(required),
        not_null=frozenset(not_null),
        defaults=tuple(defaults),
        expression_defaults=frozenset(expression_defaults),
    )
