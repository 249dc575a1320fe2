"""What the kit checks before it drains or schedules: connections a transaction-mode pooler would break, and
outbox tables older than the model.

Two checks, run by ``DrainWorker.start`` and ``OutboxScheduler.elect``
(so by the lifespan and ``outboxkit worker``) before any thread starts:

* ``session_source_accepted``: the lock and LISTEN connections
  (``OUTBOXKIT_LOCK_DATABASE_URL``, else the engine) must be sessions of
  their own (``outboxkit.storage.sessions``);
* ``check_engine``: the engine must not prepare statements by itself
  through a transaction-mode pooler (PgBouncer before 1.21 loses them),
  unless ``OUTBOXKIT_PREPARED_STATEMENTS`` says the pooler keeps them.

A failure raises ``ConfigurationError`` in production and is a warning
elsewhere (the fail direction of ``OUTBOXKIT_ENVIRONMENT``).

``DrainWorker.start`` also runs ``check_outbox_tables``: an outbox table
without the ``destination`` column (created before the column existed) is
refused in every environment, with the migration that adds it, since no claim
could run on it.  Each check
waits at most ``CHECK_SECONDS`` for the database: one that does not answer
(a dead network path) must not hold up the application's start, and the
background threads prove their own connections again anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox
from outboxkit.storage.sessions import NotASessionError, automatic_prepares_through_a_pool, check_session
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore as OutboxKit

__all__ = ["CHECK_SECONDS", "check_engine", "check_outbox_tables", "session_source_accepted"]

logger = logging.getLogger(__name__)

CHECK_SECONDS = 10.0
Result = TypeVar("Result")


def session_source_accepted(kit: OutboxKit, application_name: str, *, purpose: str) -> bool:
    """Whether the lock/LISTEN source gives sessions of their own; a transaction pool raises in production.

    False (outside production) means "refused, go on without that
    connection".  An unreachable database counts as accepted: the threads
    prove the connection when they get one.
    """
    connect = kit.session_connector(application_name)
    try:
        _within_time(lambda: check_session(connect, purpose=purpose, source=kit.session_source), what=purpose)
    except NotASessionError as exc:
        if kit.settings.is_production:
            raise
        logger.warning("%s; not in production, so this process goes on without it", exc,
                       extra=log_fields("pooler.session_refused"))
        return False
    return True


def check_engine(kit: OutboxKit) -> None:
    """Refuse (production) or warn about an engine that prepares statements through a transaction pool."""
    if kit.settings.prepared_statements:
        return  # the operator says the pooler keeps prepared statements (PgBouncer 1.21+), or there is none
    engine = kit.engine
    threshold = _within_time(
        lambda: automatic_prepares_through_a_pool(engine, application_name="outboxkit-engine-check"), what="the engine"
    )
    if threshold is None:
        return
    message = (
        f"the engine connects through a transaction-mode pooler, and psycopg prepares a statement on a "
        f"connection once it has run {threshold} times (prepare_threshold={threshold}): before PgBouncer 1.21, "
        "or without max_prepared_statements, the next run lands on a server connection that never saw it "
        "prepared, so claims and outcomes fail and rows are sent again. Build the engine with "
        "create_engine(url, connect_args={'prepare_threshold': None}); on PgBouncer 1.21+ with "
        "max_prepared_statements > 0 set OUTBOXKIT_PREPARED_STATEMENTS=true instead "
        "(docs/operations.md, 'PgBouncer and other poolers')"
    )
    if kit.settings.is_production:
        raise ConfigurationError(message)
    logger.warning("%s; not in production, so the kit goes on", message, extra=log_fields("pooler.engine_prepares"))


# Of each outbox table that exists: whether it has the destination column.
_TABLES_WITHOUT_DESTINATION = text(
    "SELECT name FROM unnest(CAST(:names AS text[])) AS name "
    "WHERE to_regclass(name) IS NOT NULL AND NOT EXISTS ("
    " SELECT FROM pg_attribute WHERE attrelid = to_regclass(name) AND attname = 'destination' AND NOT attisdropped)"
)


def check_outbox_tables(kit: OutboxKit, outboxes: list[type[Outbox]]) -> None:
    """Refuse outbox tables without the ``destination`` column, naming the migration (docs/destinations.md).

    A table that does not exist yet is left to the drain's own message (``outboxkit.storage.diagnostics``).
    """
    names = {outbox.__table__.fullname: outbox for outbox in outboxes}  # type: ignore[attr-defined]

    def read() -> list[str]:
        try:
            with kit.engine.connect() as connection:
                return list(connection.execute(_TABLES_WITHOUT_DESTINATION, {"names": sorted(names)}).scalars())
        except OperationalError:  # the database does not answer: the drains say so, and check the table when it does
            return []

    missing = _within_time(read, what="the outbox tables")
    if missing:
        classes = ", ".join(f"{names[name].__name__} ({name})" for name in missing)
        raise ConfigurationError(
            f"outbox table(s) without the destination column: {classes}; the claim reads each row's destination. "
            "Generate a migration (`alembic revision --autogenerate`: it adds the column and its index), fill it in "
            "for pending rows with outboxkit.migrations.helpers.backfill_destinations, and run `alembic upgrade heads` "
            "(docs/destinations.md, 'Upgrading an outbox table')"
        )


def _within_time(check: Callable[[], Result], *, what: str) -> Result | None:
    """``check()`` in a daemon thread, waited for at most ``CHECK_SECONDS``; None when it did not finish."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, check()))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="outboxkit-pooler-check", daemon=True)
    thread.start()
    thread.join(CHECK_SECONDS)
    if not outcome:
        logger.warning("could not check %s against poolers within %gs (the database does not answer); going on",
                       what, CHECK_SECONDS, extra=log_fields("pooler.check_timed_out"))
        return None
    finished, value = outcome[0]
    if not finished:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
