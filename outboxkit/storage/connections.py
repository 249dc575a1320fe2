"""The long-lived session connections: the leader lock and LISTEN.

Both hold session state for hours (an advisory lock, a LISTEN
registration), so they are dedicated psycopg connections in AUTOCOMMIT, not
pooled ones.  Where they come from:

* ``OUTBOXKIT_LOCK_DATABASE_URL`` set: a direct connection to that URL (the
  way round a transaction-mode pooler such as PgBouncer);
* otherwise the application's engine makes them, so whatever it connects
  with applies here too: ``connect_args`` (SSL files, options), a
  ``creator``, ``do_connect`` hooks (short-lived IAM tokens), ``connect``
  events.  The connection is detached from the engine's pool at once, so it
  takes no pool slot and is never handed to anyone else.

Either way, TCP keepalives are switched on with the given idle time, so a
peer that vanished without a word (a dead network path, a failover) shows
up as an error within about twice that, instead of a read that blocks for
the kernel's two hours.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import psycopg
from sqlalchemy import Engine

from outboxkit.errors import InvalidTypeError, InvalidValueError

__all__ = ["SessionConnector", "session_connector"]

SessionConnector = Callable[[], psycopg.Connection]


def session_connector(
    *, engine: Engine | None, dsn: str | None, application_name: str, keepalive_seconds: float, connect_timeout: float = 5.0
) -> SessionConnector:
    """A function that opens one dedicated AUTOCOMMIT session connection named ``application_name``.

    ``dsn`` wins when given; otherwise ``engine`` makes the connection.
    Connection errors surface as ``psycopg.OperationalError`` either way, so
    callers retry them alike.
    """
    if dsn is None and engine is None:
        raise InvalidValueError("session_connector needs an engine or a dsn")
    idle = max(1, round(keepalive_seconds))

    def connect() -> psycopg.Connection:
        if dsn is not None:
            connection = psycopg.connect(
                dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout)), prepare_threshold=None
            )
        else:
            assert engine is not None
            connection = _detached_from(engine)
        try:
            _enable_keepalives(connection, idle)
            connection.execute("SELECT set_config('application_name', %s, false)", [application_name])
        except BaseException:
            connection.close()
            raise
        return connection

    return connect


def _detached_from(engine: Engine) -> psycopg.Connection:
    try:
        pooled = engine.raw_connection()
    except Exception as exc:  # SQLAlchemy wraps the driver's error; callers retry on psycopg's
        original = getattr(exc, "orig", None)
        if isinstance(original, psycopg.OperationalError):
            raise original from exc
        raise psycopg.OperationalError(f"{type(exc).__name__}: {exc}") from exc
    pooled.detach()  # ours for good: closing it closes the connection, the pool forgets it
    connection = pooled.dbapi_connection
    if not isinstance(connection, psycopg.Connection):
        pooled.close()
        raise InvalidTypeError(f"the engine's driver gave a {type(connection).__name__}, not a psycopg connection")
    if connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        connection.rollback()
    connection.autocommit = True
    connection.prepare_threshold = None  # ours alone now; nothing on it is worth preparing
    return connection


def _enable_keepalives(connection: psycopg.Connection, idle_seconds: int) -> None:
    fileno = connection.pgconn.socket
    if fileno < 0:
        return
    # A duplicate descriptor of the same socket: options set on it apply to the connection's socket.
    with socket.socket(fileno=os.dup(fileno)) as handle:
        if handle.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a Unix socket has no peer to lose
        handle.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", idle_seconds), ("TCP_KEEPINTVL", max(1, idle_seconds // 3)), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                handle.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
