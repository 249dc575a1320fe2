"""Turning a database error into the one line that says how to fix it.

A missing table is the first thing a new application meets (the model is
written, the migration is not), and the raw error is a page of SQL.  The drain
logs what ``describe_database_error`` says instead, once at ERROR, and then
only at DEBUG until the schema is fixed (``SchemaProblemLog``); the CLI and
the admin show the same sentence.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from outboxkit.errors import first_line

if TYPE_CHECKING:
    from outboxkit.model import Outbox

__all__ = ["MIGRATION_HINT", "SchemaProblemLog", "describe_database_error"]

MIGRATION_HINT = (
    "run your migrations (`alembic upgrade heads`); the kit's own tables come from the `outboxkit` branch: "
    "add `outboxkit:migrations/versions` to version_locations (docs/operations.md)"
)
OUTBOX_MIGRATION_HINT = (
    "generate your application's migration for it (`alembic revision --autogenerate -m 'outbox tables'`, "
    "docs/getting-started.md) and run `alembic upgrade heads`"
)

# PostgreSQL SQLSTATEs: the same in every server language, unlike the message text.
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
_QUOTED = re.compile(r'"([^"]+)"')
_KIT_TABLE_PREFIX = "outboxkit_"


def describe_database_error(exc: BaseException, outbox: type[Outbox] | None = None) -> str | None:
    """One line that names the missing table (or column) and the migration to run; None for other errors.

    ``exc`` is what SQLAlchemy or psycopg raised (``ProgrammingError`` with an
    ``UndefinedTable`` inside, or the psycopg error itself).  ``outbox``, when
    given, is the outbox whose work failed, so its own table is named as such.
    """
    error = _psycopg_error(exc)
    if error is None:
        return None
    sqlstate = getattr(error, "sqlstate", None)
    primary = getattr(getattr(error, "diag", None), "message_primary", None) or first_line(error)
    names = _QUOTED.findall(primary)
    outbox_table: str | None = outbox.__table__.fullname if outbox is not None else None  # type: ignore[attr-defined]
    who = f"{outbox.__outbox__.job_name}: " if outbox is not None else ""
    if sqlstate == UNDEFINED_TABLE:
        missing = names[0] if names else None
        if outbox is not None and missing == outbox_table:
            return f"{who}the outbox table {missing} ({outbox.__name__}) does not exist: {OUTBOX_MIGRATION_HINT}"
        if missing is not None and missing.rpartition(".")[2].startswith(_KIT_TABLE_PREFIX):
            return f"{who}outboxkit's table {missing} does not exist: {MIGRATION_HINT}"
        return f"{who}a table is missing ({primary}): {MIGRATION_HINT}"
    if sqlstate == UNDEFINED_COLUMN:
        # 'column "x" does not exist' names no table; 'column "x" of relation "t"' does.
        where = f" in {outbox_table}" if outbox_table is not None and names[1:2] in ([], [outbox_table]) else ""
        return (
            f"{who}a column is missing{where} ({primary}): the table is older than the model; "
            "generate a migration (`alembic revision --autogenerate`) and run `alembic upgrade heads`"
        )
    return None


def _psycopg_error(exc: BaseException) -> BaseException | None:
    """The driver's error behind ``exc``: SQLAlchemy's ``.orig``, or a cause, or ``exc`` itself."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlstate", None):
            return current
        current = getattr(current, "orig", None) or current.__cause__
    return None


class SchemaProblemLog:
    """Says a schema problem once at ERROR, then at DEBUG until ``clear()`` (the problem is gone).

    ::

        problems = SchemaProblemLog(logger)
        ...
        except Exception as exc:
            if not problems.report(exc, outbox):
                logger.error("drain failed: %s", exc)     # not a schema problem: as before
        else:
            problems.clear()

    A different problem (another table, then a column) is said at ERROR again.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._said: str | None = None

    def report(self, exc: BaseException, outbox: type[Outbox] | None = None) -> str | None:
        """Log ``exc`` if it is a schema problem and return its one-line description; None (nothing logged) otherwise."""
        message = describe_database_error(exc, outbox)
        if message is None:
            return None
        if message != self._said:
            self._said = message
            self._logger.error("%s (said once; repeats are logged at DEBUG until it is fixed)", message)
        else:
            self._logger.debug("%s", message)
        return message

    def clear(self) -> None:
        """The schema works again: the next problem is said at ERROR."""
        if self._said is not None:
            self._logger.info("fixed now: %s", self._said)
            self._said = None
