"""Row assertions: ``outbox_rows`` reads an outbox's rows; ``assert_enqueued`` checks them and lists the table when not.

Both read through a ``Session``, an ``Engine`` or a ``Connection``.  An
``AsyncEngine`` works too: they read through a sync psycopg engine on the
same database (``outboxkit.storage.database.kit_engine``), made for the call and
disposed after it.  An ``AsyncSession`` or ``AsyncConnection`` cannot be
read from sync code; they are refused with the call to make instead,
``await session.run_sync(assert_enqueued, Outbox, ...)``, which also sees
what the session flushed but did not commit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, inspect, select
from sqlalchemy.orm import Session

from outboxkit.errors import ConfigurationError, InvalidTypeError, OutboxAssertionError
from outboxkit.model import KIT_COLUMNS, Outbox
from outboxkit.storage.database import kit_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

Bind = Session | Engine | Connection

__all__ = ["assert_enqueued", "outbox_rows"]

OutboxRow = TypeVar("OutboxRow", bound=Outbox)
_ROWS_SHOWN = 20  # how many rows a failure message lists before it summarises the rest


def outbox_rows(
    bind: Bind | AsyncEngine, outbox: type[OutboxRow], *, status: str | None = None
) -> list[OutboxRow]:
    """Every row of ``outbox`` (optionally of one ``status``), oldest first.

    With a ``Session`` the rows come from it (including what it has flushed
    but not committed); with an ``Engine``, ``Connection`` or ``AsyncEngine``
    they are read in a fresh session and returned detached, every column
    loaded.
    """
    statement = select(outbox).order_by(outbox.id)
    if status is not None:
        statement = statement.where(outbox.status == status)
    with _sync_bind(bind, "outbox_rows") as readable:
        if isinstance(readable, Session):
            return list(readable.scalars(statement))
        with Session(readable, expire_on_commit=False) as session:
            rows = list(session.scalars(statement))
            session.expunge_all()
        return rows


@contextmanager
def _sync_bind(bind: object, helper: str) -> Iterator[Bind]:
    """``bind`` itself, a sync engine for an ``AsyncEngine`` (disposed after), or a refusal that says what to pass."""
    if isinstance(bind, (Session, Engine, Connection)):
        yield bind
        return
    asyncio_extension = sys.modules.get("sqlalchemy.ext.asyncio")  # loaded whenever an async object exists
    if asyncio_extension is not None and isinstance(bind, asyncio_extension.AsyncEngine):
        engine = kit_engine(bind)
        try:
            yield engine
        finally:
            engine.dispose()
        return
    if asyncio_extension is not None and isinstance(bind, (asyncio_extension.AsyncSession, asyncio_extension.AsyncConnection)):
        kind = type(bind).__name__
        raise InvalidTypeError(
            f"{helper} reads synchronously and cannot use an {kind}; call it through the {kind}: "
            f"`await {kind.lower().removeprefix('async')}.run_sync({helper}, OutboxClass, ...)` "
            "(which also sees what it flushed), or pass an Engine or AsyncEngine"
        )
    raise InvalidTypeError(
        f"{helper} needs a Session, Engine, Connection or AsyncEngine, got {type(bind).__name__}"
    )


def assert_enqueued(
    bind: Bind | AsyncEngine,
    outbox: type[OutboxRow],
    *,
    count: int = 1,
    where: Mapping[str, Any] | Callable[[OutboxRow], bool] | None = None,
    status: str | None = None,
) -> list[OutboxRow]:
    """Assert that ``outbox`` holds exactly ``count`` rows matching ``where``; return them.

    ``where`` is a mapping of attribute to expected value
    (``{"order_id": order.id}``) or a function of the row; ``status``
    narrows to one status.  On a mismatch the ``OutboxAssertionError`` lists
    the rows the table holds, so the failure shows what the code wrote.
    """
    columns = _column_names(outbox)
    if isinstance(where, Mapping):
        unknown = sorted(set(where) - set(columns))
        if unknown:
            raise ConfigurationError(
                f"assert_enqueued(where=...) names {unknown}, not columns of {outbox.__name__}; "
                f"its columns: {', '.join(columns)}"
            )
    with _sync_bind(bind, "assert_enqueued") as readable:
        rows = outbox_rows(readable, outbox, status=status)
    matching = [row for row in rows if _matches(row, where)]
    if len(matching) == count:
        return matching
    wanted = f"{count} row(s) in {outbox.__tablename__}"  # type: ignore[attr-defined]
    if where is not None:
        wanted += f" matching {dict(where) if isinstance(where, Mapping) else _describe_function(where)}"
    if status is not None:
        wanted += f" with status {status!r}"
    found = f"found {len(matching)}" + (f" (ids {[row.id for row in matching]})" if matching else "")
    raise OutboxAssertionError(f"expected {wanted}, {found}; {_describe_rows(outbox, columns, rows)}")


def _matches(row: Outbox, where: Mapping[str, Any] | Callable[[Any], bool] | None) -> bool:
    if where is None:
        return True
    if isinstance(where, Mapping):
        return all(getattr(row, name) == value for name, value in where.items())
    return bool(where(row))


def _describe_function(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))


# The kit's bookkeeping columns that help read a failure; the application's own columns are all shown.
_SHOWN_KIT_COLUMNS = ("id", "status", "attempts", "next_attempt_at", "last_status_code", "last_error")


def _column_names(outbox: type[Outbox]) -> list[str]:
    return [attribute.key for attribute in inspect(outbox).column_attrs]


def _describe_rows(outbox: type[Outbox], columns: list[str], rows: Sequence[Outbox]) -> str:
    table = outbox.__tablename__  # type: ignore[attr-defined]
    if not rows:
        return f"{table} is empty"
    kit_owned = KIT_COLUMNS
    shown = [name for name in _SHOWN_KIT_COLUMNS if name in columns] + [name for name in columns if name not in kit_owned]
    lines = [
        "  " + " ".join(f"{name}={getattr(row, name)!r}" for name in shown) for row in rows[:_ROWS_SHOWN]
    ]
    if len(rows) > _ROWS_SHOWN:
        lines.append(f"  ... and {len(rows) - _ROWS_SHOWN} more")
    return f"{table} holds {len(rows)} row(s):\n" + "\n".join(lines)
