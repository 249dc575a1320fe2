"""Proof that a connection is a PostgreSQL session of its own, not a transaction-pooled one.

The leader lock and the LISTEN registration are session state: they live on
the server backend that ran the statement, for as long as that backend
lives.  A transaction-mode pooler (PgBouncer ``pool_mode = transaction``)
hands each transaction to whichever server connection is free, so behind
one a "connection" is no session at all:

* a lock taken in one transaction stays behind on a server connection that
  other clients use next; a second process whose statement lands on that
  backend gets the same lock again (session locks stack), and two processes
  believe they lead; the lock outlives both processes;
* a LISTEN registration hears notifications only while some transaction of
  ours happens to run on its backend.

So before the kit takes the lock or LISTENs, ``prove_session`` checks the
two things a session guarantees and a transaction pool does not:

1. *Its backend does not change.*  Our connection must still be on the
   backend it started on, with the token it set there (a custom setting
   that only that backend has): at the start of each round, right after the
   second connection released the server connection it used, which a
   transaction pool hands out next (PgBouncer reuses the most recently
   released first), and again while the second connection holds a
   transaction open.
2. *No one else shares its backend.*  The second connection opens a
   transaction and reads ``pg_backend_pid()``.  Behind a transaction pool
   it is handed a free server connection, and the one our connection just
   used is free and was released last, so the pids match.

Three rounds of this.  Each step of a round runs right after the other
connection's release, so a transaction pool is caught unless another
client takes and releases server connections between every two of our
statements: with a pool of one the proof fails every time, and two
processes proving at the same moment do not fool each other (the order
matters: a round that let the second connection release last would hand it
the same other backend round after round).  Under heavy load from other
clients a proof could in principle still be fooled, which is why the
leader also re-checks its backend on every tick (``on_own_backend``) and
demotes itself when it moved.  A direct connection or a session-mode pool
passes every time.

A failed proof raises ``NotASessionError`` (a ``ConfigurationError``) that
names ``OUTBOXKIT_LOCK_DATABASE_URL`` and says why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from outboxkit.errors import ConfigurationError
from outboxkit.storage.connections import SessionConnector, session_connector

__all__ = [
    "NotASessionError",
    "automatic_prepares_through_a_pool",
    "SessionIdentity",
    "check_session",
    "end_stranded_backend",
    "not_a_session",
    "on_own_backend",
    "prove_session",
]

# A custom setting (placeholder variable): only the backend it was set on has
# it, and poolers do not track or copy it between server connections.
TOKEN_SETTING = "outboxkit.session_token"
PROOF_ROUNDS = 3
LOCK_SETTING = "OUTBOXKIT_LOCK_DATABASE_URL"

_SET_TOKEN = (
    "SELECT pg_backend_pid(), set_config(%s, %s, false), "
    "(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
)
# One statement, so both facts come from one backend.
ON_OWN_BACKEND = "pg_backend_pid() = {pid:d} AND current_setting('" + TOKEN_SETTING + "', true) IS NOT DISTINCT FROM {token}"


class NotASessionError(ConfigurationError):
    """The lock or LISTEN connection is not a session of its own (a transaction-mode pooler)."""


@dataclass(frozen=True)
class SessionIdentity:
    """The backend a proven connection is on: its pid, when it started, and the token set there."""

    backend_pid: int
    backend_start: datetime | None
    token: str

    def predicate(self) -> str:
        """SQL that is true only on this backend (the token is a hex UUID, never user text)."""
        return ON_OWN_BACKEND.format(pid=self.backend_pid, token=f"'{self.token}'")


def prove_session(connection: psycopg.Connection, connect: SessionConnector, *, purpose: str, source: str) -> SessionIdentity:
    """Prove ``connection`` (from ``connect``) keeps one backend of its own; raise ``NotASessionError`` if not.

    ``purpose`` says what the connection is for ("the leader lock
    connection"), ``source`` where it comes from (the setting), both for the
    message.  Connection errors (``psycopg.Error``) propagate as they are.
    """
    token = uuid.uuid4().hex
    answer = connection.execute(_SET_TOKEN, [TOKEN_SETTING, token]).fetchone()
    assert answer is not None  # a SELECT without FROM returns one row
    identity = SessionIdentity(backend_pid=answer[0], backend_start=answer[2], token=token)
    other = connect()
    try:
        for _ in range(PROOF_ROUNDS):
            if not on_own_backend(connection, identity):
                raise not_a_session(purpose, source, "its statements ran on different server backends")
            with other.transaction():
                row = other.execute("SELECT pg_backend_pid()").fetchone()
                if row is not None and row[0] == identity.backend_pid:
                    raise not_a_session(purpose, source, f"a second connection was given the same server backend ({row[0]})")
                if not on_own_backend(connection, identity):
                    raise not_a_session(purpose, source, "its statements ran on different server backends")
    finally:
        other.close()
    return identity


def on_own_backend(connection: psycopg.Connection, identity: SessionIdentity) -> bool:
    """Whether ``connection``'s next statement still runs on the proven backend."""
    row = connection.execute(f"SELECT {identity.predicate()}").fetchone()
    return bool(row is not None and row[0])


def check_session(connect: SessionConnector, *, purpose: str, source: str) -> bool:
    """Open a connection, prove it, close it.  True when proven; False when the database could not be reached.

    For the start of the election and the drain worker
    (``outboxkit.drain.pooler_checks``): a misconfigured connection is refused
    (``NotASessionError``) before any thread starts, while a database error
    (unreachable, a failover) is left to the background retries.
    """
    try:
        connection = connect()
    except psycopg.Error:
        return False
    try:
        prove_session(connection, connect, purpose=purpose, source=source)
    except psycopg.Error:
        return False
    finally:
        connection.close()
    return True


def not_a_session(purpose: str, source: str, evidence: str) -> NotASessionError:
    """The refusal, with the evidence, the reason and the setting that fixes it."""
    return NotASessionError(
        f"{purpose} ({source}) is not a PostgreSQL session of its own: {evidence}. "
        "That is what a transaction-mode pooler does (PgBouncer pool_mode=transaction): it hands each "
        "transaction to whichever server connection is free, so a session advisory lock or a LISTEN would "
        "stay behind on a server connection other clients use, the lock could be granted to two processes "
        f"and outlive both. Set {LOCK_SETTING} to a direct connection to PostgreSQL or to a session-mode "
        "pool (docs/operations.md, 'PgBouncer and other poolers'); the engine may stay on the transaction pool"
    )


# The backend that took the lock, found by pid and start time (a pid alone
# may have been reused), still holding the key, and idle: no transaction of
# another client runs on it, so ending it costs nobody a statement.
_END_STRANDED = """
SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity AS a
WHERE a.pid = %s AND a.backend_start = %s AND a.state = 'idle' AND a.pid <> pg_backend_pid()
AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE {lock_predicate} AND l.pid = a.pid)
"""


def end_stranded_backend(connection: psycopg.Connection, identity: SessionIdentity, *, lock_predicate: str) -> bool:
    """End the server backend that still holds a lock our connection can no longer reach; True if it was ended.

    Only reached behind a transaction pool that slipped past the proof: the
    lock stays on the backend it was taken on, which the pooler keeps open
    for other clients, so no unlock of ours can reach it.  The backend is
    ended only while it is idle and still holds the key; otherwise it is
    left alone (the pooler closes it at its ``server_lifetime``).
    """
    if identity.backend_start is None:
        return False
    query = _END_STRANDED.format(lock_predicate=lock_predicate)
    row = connection.execute(query, [identity.backend_pid, identity.backend_start]).fetchone()
    return bool(row is not None and row[0])


def automatic_prepares_through_a_pool(engine: Engine, *, application_name: str) -> int | None:
    """psycopg's ``prepare_threshold`` on ``engine``'s connections when they go through a transaction-mode
    pooler and prepare statements by themselves; None when that is not so.

    Before PgBouncer 1.21 (or without ``max_prepared_statements``) such an
    engine fails at random once a statement has run ``prepare_threshold``
    times on a connection: the next run goes to a server connection that
    never saw it prepared.  The kit's own claim runs through the engine.
    A database that cannot be reached raises ``psycopg.OperationalError``:
    nothing is known about pooling yet.
    """
    try:
        with engine.connect() as connection:
            threshold = getattr(connection.connection.driver_connection, "prepare_threshold", None)
    except DBAPIError as exc:
        raise psycopg.OperationalError(f"the database could not be reached: {exc.orig}") from exc
    if threshold is None:
        return None
    connect = session_connector(engine=engine, dsn=None, application_name=application_name, keepalive_seconds=15)
    try:
        if not check_session(connect, purpose="the engine's connection", source="the engine"):
            raise psycopg.OperationalError("the database could not be reached")
    except NotASessionError:
        return int(threshold)
    return None
