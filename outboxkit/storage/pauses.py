"""Paused outboxes: an operator stops an outbox's drains, in every process, until resumed.

A pause is one row in ``outboxkit_outbox_pauses`` (who paused it, when).
Every drainer asks ``PauseCheck.paused()`` before each claim.  A pause and a
resume each notify ``PAUSES_CHANNEL`` in their transaction, and every
draining process LISTENs on it (``outboxkit.drain.worker``), so:

* while the drainer's listener is connected (``PauseCheck.follow``), its
  answer is kept until such a notification (or the listener's loss or
  reconnection) says it may have changed, and for at most
  ``PAUSE_TRUST_SECONDS``: an insert's wake-up claims without reading it
  again, and a pause or resume takes effect at once in every listening
  process;
* without a listener, the answer is kept for ``PAUSE_CACHE_SECONDS`` and
  forgotten on every wake-up (it may be a resume), so a pause or resume
  takes effect within that time.

A paused outbox costs one indexed read per drainer when it changes (every
few seconds without a listener).  A paused outbox's drains claim nothing:
rows stay ``pending`` and keep their due times, inserts keep piling up,
nothing is lost, and the rows already in flight finish normally.  The
leader's safety-net drain job runs and claims nothing too.

Without the table (the kit's migration ``outboxkit_0003`` not run yet) no
outbox is paused: a missing table must not stop delivery.

Call ``is_paused(connection, job_name)`` for one uncached answer;
``pause``/``resume`` change the state (the admin audits them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import ProgrammingError

from outboxkit.storage.tables import outbox_pauses
from outboxkit.telemetry.log_events import log_fields

__all__ = [
    "PAUSES_CHANNEL",
    "PAUSE_CACHE_SECONDS",
    "PAUSE_TRUST_SECONDS",
    "Pause",
    "PauseCheck",
    "is_paused",
    "pause",
    "paused_outboxes",
    "resume",
]

logger = logging.getLogger(__name__)

# How long a drainer keeps its answer without a listener, and with one.  The
# bound with a listener covers a pause made by a process that does not
# notify (an older version of the kit during a rolling upgrade).
PAUSE_CACHE_SECONDS = 2.0
PAUSE_TRUST_SECONDS = 60.0

# Notified with the job name by every pause and resume.  An outbox's own
# channel is ``outboxkit_<name>`` (outboxkit.storage.notify), so this one, with its
# hyphen, never meets one.
PAUSES_CHANNEL = "outboxkit-pauses"


@dataclass(frozen=True, kw_only=True, slots=True)
class Pause:
    """One paused outbox."""

    outbox: str
    paused_at: datetime
    paused_by: str


def is_paused(connection: Connection, job_name: str) -> bool:
    """Whether ``job_name``'s drains are paused (one primary-key read)."""
    statement = select(outbox_pauses.c.outbox).where(outbox_pauses.c.outbox == job_name)
    return connection.execute(statement).first() is not None


def paused_outboxes(connection: Connection) -> dict[str, Pause]:
    """Every paused outbox, by job name."""
    return {row.outbox: Pause(**row._mapping) for row in connection.execute(select(outbox_pauses))}


def pause(connection: Connection, job_name: str, *, actor: str, now: datetime) -> bool:
    """Pause ``job_name``'s drains; False if it was paused already (nothing changes then).

    A change notifies ``PAUSES_CHANNEL`` when the caller's transaction commits.
    """
    statement = (
        insert(outbox_pauses)
        .values(outbox=job_name, paused_at=now, paused_by=actor[:300])
        .on_conflict_do_nothing(index_elements=[outbox_pauses.c.outbox])
        .returning(outbox_pauses.c.outbox)
    )
    return _notify_if(connection.execute(statement).first() is not None, connection, job_name)


def resume(connection: Connection, job_name: str) -> bool:
    """Resume ``job_name``'s drains; False if it was not paused.

    A change notifies ``PAUSES_CHANNEL`` when the caller's transaction commits.
    """
    statement = delete(outbox_pauses).where(outbox_pauses.c.outbox == job_name).returning(outbox_pauses.c.outbox)
    return _notify_if(connection.execute(statement).first() is not None, connection, job_name)


def _notify_if(changed: bool, connection: Connection, job_name: str) -> bool:
    if changed:  # delivered on commit: listening drainers drop their cached answer then
        connection.execute(select(func.pg_notify(PAUSES_CHANNEL, job_name)))
    return changed


class PauseCheck:
    """A drainer's cached view of its outbox's pause (see the module).  Thread-safe.

    ``cache_seconds`` bounds how long an answer is kept without a listener,
    ``trust_seconds`` with one (``follow(True)``).
    """

    def __init__(
        self,
        engine: Engine,
        job_name: str,
        *,
        cache_seconds: float = PAUSE_CACHE_SECONDS,
        trust_seconds: float = PAUSE_TRUST_SECONDS,
    ) -> None:
        self.engine = engine
        self.job_name = job_name
        self.cache_seconds = cache_seconds
        self.trust_seconds = trust_seconds
        self._lock = threading.Lock()
        self._answer = False
        self._read_at = float("-inf")
        # Counts forget() calls: a read that a forget() overtook is not kept (it may predate the change).
        self._generation = 0
        self._following = False
        self._missing_reported = False

    @property
    def following(self) -> bool:
        """True while a listener delivers this outbox's pause notifications (``follow``)."""
        return self._following

    def paused(self) -> bool:
        with self._lock:
            kept = self.trust_seconds if self._following else self.cache_seconds
            if time.monotonic() - self._read_at < kept:
                return self._answer
            generation = self._generation
        answer = self._read()
        with self._lock:
            if self._generation == generation:
                self._answer, self._read_at = answer, time.monotonic()
        return answer

    def forget(self) -> None:
        """Drop the cached answer: the pause may have changed (a notification, a resume, a pause here)."""
        with self._lock:
            self._generation += 1
            self._read_at = float("-inf")

    def woken(self) -> None:
        """A wake-up of the drain: without a listener it may follow a resume, so the answer is dropped.

        With a listener, a resume announced itself on ``PAUSES_CHANNEL``: an
        insert's wake-up keeps the answer and the claim reads nothing more.
        """
        if not self._following:
            self.forget()

    def follow(self, following: bool) -> None:
        """The listener LISTENs on ``PAUSES_CHANNEL`` (True) or lost its connection (False).

        Either way the answer is dropped: a change may have been missed
        while nobody listened, and from a loss on, it is kept only
        ``cache_seconds`` again.
        """
        with self._lock:
            self._following = following
            self._generation += 1
            self._read_at = float("-inf")

    def _read(self) -> bool:
        try:
            # AUTOCOMMIT: one round trip (no BEGIN before the read, no ROLLBACK after it); a wake-up
            # reads it again before its claim, so it is on the path from NOTIFY to send.
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                return is_paused(connection, self.job_name)
        except ProgrammingError as exc:
            if getattr(getattr(exc, "orig", None), "sqlstate", None) != "42P01":  # undefined table
                raise
            if not self._missing_reported:
                self._missing_reported = True
                logger.warning(
                    "%s: outboxkit_outbox_pauses does not exist, so this outbox cannot be paused; "
                    "run the kit's migration outboxkit_0003 (`alembic upgrade heads`)",
                    self.job_name,
                    extra=log_fields("pause.table_missing", self.job_name),
                )
            return False
