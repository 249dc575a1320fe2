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
elsewhere (the fail direction of ``OUTBOXKIT_ENVIRONMENT``).  Each is
decided once per kit (``outboxkit.storage.pooler_verdict``): the first check's
answer stands for the drain loops and the election alike, and a refusal
sticks, so every later start of the kit raises it again.  In production
the leader re-checks the engine from its tick (``recheck_engine``); a
refusal then stops the scheduler and the kit's drain loops.

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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import psycopg
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox
from outboxkit.storage.sessions import NotASessionError, automatic_prepares_through_a_pool, check_session
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore as OutboxKit

__all__ = ["CHECK_SECONDS", "RECHECK_SECONDS", "check_engine", "check_outbox_tables", "recheck_engine", "session_source_accepted"]

logger = logging.getLogger(__name__)

CHECK_SECONDS = 10.0
RECHECK_SECONDS = 60.0
Result = TypeVar("Result")


def session_source_accepted(kit: OutboxKit, application_name: str, *, purpose: str) -> bool:
    """Whether the lock/LISTEN source gives sessions of their own; a transaction pool raises in production.

    False (outside production) means "refused, go on without that
    connection".  An unreachable database counts as accepted: the threads
    prove the connection when they get one.  The first answer stands for
    the kit (both connections come from the same source).
    """
    verdict = kit.pooler_verdict
    _raise_kept_refusal(kit)
    accepted = verdict.session_source_accepted
    if accepted is not None:
        return accepted
    connect = kit.session_connector(application_name)
    try:
        proven = _within_time(lambda: check_session(connect, purpose=purpose, source=kit.session_source), what=purpose)
    except NotASessionError as exc:
        if kit.settings.is_production:
            verdict.refuse(exc)
            raise
        verdict.session_source_checked(False)
        logger.warning("%s; not in production, so this process goes on without it", exc,
                       extra=log_fields("pooler.session_refused"))
        return False
    if proven:  # unreachable or no answer in time: accepted for now, decided by a later check
        verdict.session_source_checked(True)
    return True


def check_engine(kit: OutboxKit) -> None:
    """Refuse (production) or warn about an engine that prepares statements through a transaction pool.

    Checked once per kit: a later call repeats the first one's answer.
    """
    _raise_kept_refusal(kit)
    if kit.pooler_verdict.engine_decided:
        return
    told, message = _engine_problem(kit)
    if not told:
        return  # no answer (the database did not answer in time): no verdict, the next start checks again
    kit.pooler_verdict.engine_checked()
    if message is None:
        return
    if kit.settings.is_production:
        error = ConfigurationError(message)
        kit.pooler_verdict.refuse(error)
        raise error
    logger.warning("%s; not in production, so the kit goes on", message, extra=log_fields("pooler.engine_prepares"))


def recheck_engine(kit: OutboxKit) -> bool:
    """The leader's re-check on its tick: False when the kit refuses its engine (now or before).

    Only in production, where a refusal is final: it is kept
    (``PoolerVerdict.refuse``), which stops the kit's drain loops, and the
    election that asked stops leading.  Outside production a refusal is a
    warning at start, not repeated on every tick.  The engine is looked at
    on the first tick and then at most every ``RECHECK_SECONDS`` (the proof
    opens two connections).
    """
    if not kit.settings.is_production:
        return True
    if kit.pooler_verdict.refusal is not None:
        return False
    if not kit.pooler_verdict.recheck_due(time.monotonic(), every_seconds=RECHECK_SECONDS):
        return True
    _, message = _engine_problem(kit)
    if message is None:
        return True
    logger.error("%s; refused on the leader's re-check: this process stops leading and draining", message,
                 extra=log_fields("pooler.engine_refused_on_tick"))
    kit.pooler_verdict.refuse(ConfigurationError(message))
    return False


def _raise_kept_refusal(kit: OutboxKit) -> None:
    refusal = kit.pooler_verdict.refusal
    if refusal is not None and kit.settings.is_production:
        raise type(refusal)(f"this kit refused its connections already, which stands for all of it: {refusal}")


def _engine_problem(kit: OutboxKit) -> tuple[bool, str | None]:
    """Whether the check could tell, and why the engine is not fit to drain or schedule through its pooler (or None)."""
    if kit.settings.prepared_statements:
        return True, None  # the operator says the pooler keeps prepared statements (PgBouncer 1.21+), or there is none
    engine = kit.drain_database.engine  # connects as the application's engine does (outboxkit.storage.drain_pool)
    try:
        answer = _within_time(  # None only when the check did not finish in time; (threshold,) when it did
            lambda: (automatic_prepares_through_a_pool(engine, application_name="outboxkit-engine-check"),),
            what="the engine",
        )
    except psycopg.OperationalError:
        return False, None  # unreachable now: the drain reports it; nothing to say about pooling yet
    if answer is None:
        return False, None
    (threshold,) = answer
    if threshold is None:
        return True, None
    return True, (
        f"the engine connects through a transaction-mode pooler, and psycopg prepares a statement on a "
        f"connection once it has run {threshold} times (prepare_threshold={threshold}): before PgBouncer 1.21, "
        "or without max_prepared_statements, the next run lands on a server connection that never saw it "
        "prepared, so claims and outcomes fail and rows are sent again. Build the engine with "
        "create_engine(url, connect_args={'prepare_threshold': None}); on PgBouncer 1.21+ with "
        "max_prepared_statements > 0 set OUTBOXKIT_PREPARED_STATEMENTS=true instead "
        "(docs/operations.md, 'PgBouncer and other poolers')"
    )


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
            with kit.drain_database.engine.connect() as connection:
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
