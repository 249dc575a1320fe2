"""The leader lock: the PostgreSQL session advisory lock the election campaigns for.

What ``outboxkit.leader.election`` runs on its lock connection, and who holds the
lock, in one place: the campaign's ``try_acquire_query`` (which also returns
the session's ``pg_backend_pid()``), the leader tick's ``still_held_query``,
the shutdown's ``unlock_query``, and ``lock_holders`` / ``current_leader``
for the admin and the CLI.  The campaign, the tick and the unlock each take
the predicate of the proven backend (``outboxkit.storage.sessions``), so none of them
acts on a backend a pooler swapped in.  The lock connection is named
``outboxkit-leader:<host>:<pid>`` (``leader_application_name``), so
``pg_stat_activity`` says which process leads.

Advisory keys are per database while ``pg_locks`` is cluster-wide, so every
query on ``pg_locks`` here carries the database predicate.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, text

from outboxkit.settings import DEFAULT_ADVISORY_LOCK_KEY

__all__ = [
    "APPLICATION_NAME_PREFIX",
    "LockHolder",
    "current_leader",
    "key_predicate",
    "leader_application_name",
    "lock_holders",
    "still_held_query",
    "try_acquire_query",
    "unlock_query",
]

APPLICATION_NAME_PREFIX = "outboxkit-leader:"
_APPLICATION_NAME_LIMIT = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer names

# A bigint advisory key appears in pg_locks split in two: classid holds the
# high 32 bits and objid the low 32 bits (both as unsigned oids), with
# objsubid = 1 (objsubid = 2 marks the two-int4 form).  The values are
# integers computed here, never user text, so they are formatted in.
_KEY_PREDICATE = """
    l.locktype = 'advisory'
    AND l.granted
    AND l.classid::int8 = {classid}
    AND l.objid::int8 = {objid}
    AND l.objsubid = 1
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_STILL_HELD = "SELECT 1 FROM pg_locks AS l WHERE {predicate} AND l.pid = pg_backend_pid()"
_HOLDERS = """
SELECT l.pid, a.application_name, a.backend_start
FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE {predicate}
ORDER BY a.backend_start
"""

def key_predicate(key: int) -> str:
    """The ``pg_locks`` predicate for ``key`` in this database (a 64-bit key as PostgreSQL splits it)."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return _KEY_PREDICATE.format(classid=unsigned >> 32, objid=unsigned & 0xFFFF_FFFF)


def leader_application_name(host: str | None = None, pid: int | None = None) -> str:
    """``outboxkit-leader:<host>:<pid>``, with the host shortened to fit PostgreSQL's 63 bytes."""
    host = host if host is not None else socket.gethostname()
    pid = pid if pid is not None else os.getpid()
    room = _APPLICATION_NAME_LIMIT - len(APPLICATION_NAME_PREFIX) - len(f":{pid}")
    return f"{APPLICATION_NAME_PREFIX}{host.encode()[:room].decode(errors='ignore')}:{pid}"


def try_acquire_query(backend_predicate: str) -> str:
    """The campaign (one parameter, the key): the lock if it is free and the statement runs on the proven backend
    (NULL elsewhere: nothing taken), and the backend's pid."""
    return f"SELECT CASE WHEN {backend_predicate} THEN pg_try_advisory_lock(%s::bigint) END, pg_backend_pid()"


def still_held_query(key: int, backend_predicate: str) -> str:
    """The leader tick: one row while this session, on the proven backend, still holds ``key`` in this database."""
    return _STILL_HELD.format(predicate=key_predicate(key)) + f" AND {backend_predicate}"


def unlock_query(backend_predicate: str) -> str:
    """The shutdown (one parameter, the key): give the lock back on the backend that took it only (NULL elsewhere:
    an unlock on another backend could pop another holder's lock); it also dies with the session."""
    return f"SELECT CASE WHEN {backend_predicate} THEN pg_advisory_unlock(%s::bigint) END"


@dataclass(frozen=True)
class LockHolder:
    """A session holding the leader key in this database."""

    backend_pid: int
    host: str | None  # from application_name; None if the holder is not an outboxkit election
    pid: int | None
    since: datetime | None  # backend_start of the lock connection, i.e. when it connected to lead
    application_name: str | None


def lock_holders(connection: Connection, *, key: int = DEFAULT_ADVISORY_LOCK_KEY) -> list[LockHolder]:
    """Every session holding ``key`` in the connection's database (normally zero or one)."""
    rows = connection.execute(text(_HOLDERS.format(predicate=key_predicate(key)))).all()
    return [_holder(backend_pid, name, since) for backend_pid, name, since in rows]


def current_leader(engine: Engine, *, key: int = DEFAULT_ADVISORY_LOCK_KEY) -> LockHolder | None:
    """Who leads now (host, pid, since), or None.  For the admin and the CLI.

    ``pg_stat_activity`` shows another role's ``application_name`` only to
    members of ``pg_read_all_stats``; without it ``host`` and ``pid`` are None.
    """
    with engine.connect() as connection:
        holders = lock_holders(connection, key=key)
    return holders[0] if holders else None


def _holder(backend_pid: int, application_name: str | None, since: datetime | None) -> LockHolder:
    host = pid = None
    if application_name and application_name.startswith(APPLICATION_NAME_PREFIX):
        rest = application_name[len(APPLICATION_NAME_PREFIX) :]
        host, separator, pid_text = rest.rpartition(":")
        pid = int(pid_text) if separator and pid_text.isdigit() else None
        host = host if pid is not None else rest  # no ":<pid>" at the end: the name is all host
    return LockHolder(backend_pid=backend_pid, host=host, pid=pid, since=since, application_name=application_name)
