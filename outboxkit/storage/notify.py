"""Waking the drain: NOTIFY on insert and on reset, LISTEN in every draining process.

An insert into an outbox issues ``NOTIFY <channel>`` when its transaction
commits (PostgreSQL delivers notifications only on commit, so the drain
never wakes for a row it cannot see yet), unless a wake-up of its outbox is
pending already (``outboxkit.storage.wakeups``); the admin's resets notify too.
Every process that drains (``outboxkit.drain.worker``) holds one
``NotifyListener`` connection with ``LISTEN`` and wakes that outbox's drain
loop at once.  A notification can be lost (the listener's connection drops);
that costs latency until the loop's next due-time wake or poll, never a
delivery, and each time the listener (re)connects it wakes each loop once to
catch up on what it may have missed.

Install the trigger from the application's Alembic migration::

    from outboxkit.storage.notify import install_trigger_sql

    def upgrade():
        for statement in install_trigger_sql(CreditGrantOutbox):
            op.execute(statement)

or, instead of a trigger, notify from the enqueue path in the same
transaction: ``session.execute(notify_statement(CreditGrantOutbox))``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

import psycopg
from psycopg import sql
from sqlalchemy import TextClause, text
from tenacity import Retrying, retry_if_exception_type, wait_exponential_jitter

from outboxkit.errors import InvalidValueError
from outboxkit.model import Outbox
from outboxkit.storage.connections import SessionConnector, session_connector
from outboxkit.storage.sessions import NotASessionError, SessionIdentity, not_a_session, on_own_backend, prove_session
from outboxkit.storage.wakeups import trigger_body
from outboxkit.telemetry.log_events import log_fields

__all__ = [
    "NotifyListener",
    "channel_for",
    "drop_trigger_sql",
    "install_trigger_sql",
    "notify_statement",
]

logger = logging.getLogger(__name__)

_IDENTIFIER_LIMIT = 63


def _short_identifier(name: str) -> str:
    if len(name) <= _IDENTIFIER_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _IDENTIFIER_LIMIT - 9]}_{digest}"


def channel_for(outbox: type[Outbox]) -> str:
    """The NOTIFY channel of an outbox: ``outboxkit_<job_name>`` (``-`` as ``_``), at most 63 characters."""
    return _short_identifier(f"outboxkit_{outbox.__outbox__.settings_key}")


def _function_name(outbox: type[Outbox]) -> str:
    return _short_identifier(f"outboxkit_notify_{outbox.__tablename__}")  # type: ignore[attr-defined]


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _table_reference(outbox: type[Outbox]) -> str:
    table = outbox.__table__  # type: ignore[attr-defined]
    return f"{_quote(table.schema)}.{_quote(table.name)}" if table.schema else _quote(table.name)


def install_trigger_sql(outbox: type[Outbox]) -> list[str]:
    """The statements that make inserts into ``outbox`` wake its drain; run each with ``op.execute``.

    A statement-level trigger: a bulk insert of 1,000 rows sends one
    notification, not 1,000; and an insert notifies only when no wake-up of
    the outbox is pending already (``outboxkit.storage.wakeups``), so
    producers that commit at once do not queue behind the server's
    notification lock.  Re-running the statements is harmless, and replaces
    the function of a trigger installed by an older version.
    """
    function = _quote(_function_name(outbox))
    trigger = _quote(_short_identifier(f"{_function_name(outbox)}_insert"))
    return [
        f"""CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
{trigger_body(channel_for(outbox))}
$$""",
        f"DROP TRIGGER IF EXISTS {trigger} ON {_table_reference(outbox)}",
        f"CREATE TRIGGER {trigger} AFTER INSERT ON {_table_reference(outbox)} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
    ]


def drop_trigger_sql(outbox: type[Outbox]) -> list[str]:
    """The statements that undo ``install_trigger_sql`` (for a migration's ``downgrade``)."""
    function = _quote(_function_name(outbox))
    trigger = _quote(_short_identifier(f"{_function_name(outbox)}_insert"))
    return [f"DROP TRIGGER IF EXISTS {trigger} ON {_table_reference(outbox)}", f"DROP FUNCTION IF EXISTS {function}()"]


def notify_statement(outbox: type[Outbox]) -> TextClause:
    """``NOTIFY`` for ``outbox``, to execute in the enqueueing transaction when no trigger is installed."""
    return text("SELECT pg_notify(:channel, '')").bindparams(channel=channel_for(outbox))


def listener_application_name() -> str:
    """``outboxkit-listener:<host>:<pid>``, cut to PostgreSQL's 63 bytes."""
    return f"outboxkit-listener:{socket.gethostname()}:{os.getpid()}"[:63]


class NotifyListener:
    """Holds a LISTEN connection and calls ``channels[channel]()`` for each notification.

    Each time it starts LISTENing, it calls every callback once: notifications
    sent while nobody listened are gone.  After a dropped connection it
    reconnects with jittered exponential backoff (tenacity) and LISTENs again.
    ``generation`` counts successful (re)connections; tests wait on it.

    Each connection is proven a session of its own before it LISTENs
    (``outboxkit.storage.sessions``), and every ``session_check_seconds`` while it
    listens it checks it is still on that backend.  A connection through a
    transaction-mode pooler is refused: ``refusal`` holds the
    ``NotASessionError``, it is logged, and the listener stops (the drain
    loops go on at due times and polls).

    ``on_connection(connected, reconnected)``, if given, is called on each
    connection (``reconnected`` after the first) and each loss.
    """

    def __init__(
        self,
        *,
        dsn: str | None = None,
        connect: SessionConnector | None = None,
        channels: Mapping[str, Callable[[], None]],
        poll_seconds: float = 0.25,
        max_backoff_seconds: float = 10.0,
        source: str = "the LISTEN connection's source",
        session_check_seconds: float = 15.0,
        on_connection: Callable[[bool, bool], None] | None = None,
    ) -> None:
        if not channels:
            raise InvalidValueError("NotifyListener needs at least one channel")
        if (dsn is None) == (connect is None):
            raise InvalidValueError("NotifyListener needs exactly one of dsn= or connect= (outboxkit.storage.connections)")
        self.dsn = dsn
        self.channels = dict(channels)
        self.poll_seconds = poll_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.source = source
        self.session_check_seconds = session_check_seconds
        self.refusal: NotASessionError | None = None
        self._identity: SessionIdentity | None = None
        self.application_name = listener_application_name()
        self._open = connect or session_connector(
            engine=None, dsn=dsn, application_name=self.application_name, keepalive_seconds=15
        )
        self._stopping = threading.Event()
        self._changed = threading.Condition()
        self.generation = 0
        self.backend_pid: int | None = None
        # (connected, reconnected): the worker hands it to telemetry (the listener's connection gauges).
        self._on_connection = on_connection or (lambda connected, reconnected: None)
        self._thread = threading.Thread(target=self._run, name="outboxkit-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        self._stopping.set()
        if wait and self._thread.is_alive():
            self._thread.join()

    def wait_for_generation(self, generation: int, timeout: float) -> bool:
        """Block until the listener has LISTENed ``generation`` times; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.generation >= generation, timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                connection = self._connect()
            except NotASessionError as exc:
                self._refuse(exc)
                return
            if connection is None:
                return
            try:
                self._listen(connection)
            except NotASessionError as exc:
                self._refuse(exc)
                return
            except psycopg.Error as exc:
                if not self._stopping.is_set():
                    logger.warning("listener lost its connection (%s); reconnecting", str(exc).strip() or type(exc).__name__,
                                   extra=log_fields("notify.connection_lost"))
            finally:
                self.backend_pid = None
                connection.close()
                self._on_connection(False, False)

    def _refuse(self, exc: NotASessionError) -> None:
        logger.error("the listener stops: %s; the drain loops go on at due times and polls", exc,
                     extra=log_fields("notify.refused"))
        with self._changed:
            self.refusal = exc
            self._changed.notify_all()

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stop cuts the backoff short

    def _connect(self) -> psycopg.Connection | None:
        retrying = Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            wait=wait_exponential_jitter(multiplier=0.05, max=self.max_backoff_seconds, jitter=0.05),
            stop=lambda retry_state: self._stopping.is_set(),
            sleep=self._sleep,
            before_sleep=lambda state: logger.warning(
                "listener cannot connect: %s", state.outcome.exception() if state.outcome else "?",
                extra=log_fields("notify.connect_failed"),
            ),
            reraise=True,
        )
        try:
            return retrying(self._open_listening)
        except psycopg.OperationalError:
            # Only once stop() was called: the retries end then, with the database still away.
            return None

    def _open_listening(self) -> psycopg.Connection:
        """One attempt: a new connection that LISTENs on every channel (closed again if a LISTEN fails)."""
        connection = self._open()
        try:
            identity = prove_session(connection, self._open, purpose="the LISTEN connection", source=self.source)
            for channel in self.channels:
                connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self._check_backend(connection, identity)
            self._identity = identity
        except BaseException:
            connection.close()
            raise
        return connection

    def _listen(self, connection: psycopg.Connection) -> None:
        self.backend_pid = connection.info.backend_pid
        with self._changed:
            self.generation += 1
            reconnected = self.generation > 1
            self._changed.notify_all()
        self._on_connection(True, reconnected)
        if reconnected:
            logger.info("listener reconnected; waking every drain once to catch up", extra=log_fields("notify.reconnected"))
        # Notifications sent while nobody listened (before this leader, or
        # while disconnected) are gone: one drain each picks up what they announced.
        for callback in self.channels.values():
            callback()
        next_check = time.monotonic() + self.session_check_seconds
        while not self._stopping.is_set():
            for notification in connection.notifies(timeout=self.poll_seconds):
                woken = self.channels.get(notification.channel)
                if woken is not None:
                    woken()
            if self._identity is not None and time.monotonic() >= next_check:
                self._check_backend(connection, self._identity)
                next_check = time.monotonic() + self.session_check_seconds

    def _check_backend(self, connection: psycopg.Connection, identity: SessionIdentity) -> None:
        """Raise ``NotASessionError`` when the connection's statements no longer run on the proven backend."""
        if not on_own_backend(connection, identity):
            raise not_a_session("the LISTEN connection", self.source, "its statements moved to another server backend")
