"""Paused outboxes: an operator stops an outbox's drains, in every process, until resumed.

A pause is one row in ``outboxkit_outbox_pauses`` (who paused it, when).
Every drainer asks ``PauseCheck.paused()`` before each claim; the answer is
cached for ``PAUSE_CACHE_SECONDS`` and forgotten on a wake-up, so a paused
outbox costs one indexed read every few seconds per drainer, and a pause or
resume takes effect within that time everywhere (at once in a drainer woken
by the resume's NOTIFY).  A paused outbox's drains claim nothing: rows stay
``pending`` and keep their due times, inserts keep piling up, nothing is
lost, and the rows already in flight finish normally.  The leader's
safety-net drain job runs and claims nothing too.

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

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import ProgrammingError

from outboxkit.log_events import log_fields
from outboxkit.tables import outbox_pauses

__all__ = ["PAUSE_CACHE_SECONDS", "Pause", "PauseCheck", "is_paused", "pause", "paused_outboxes", "resume"]

logger = logging.getLogger("outboxkit.pauses")

PAUSE_CACHE_SECONDS = 2.0


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
    """Pause ``job_name``'s drains; False if it was paused already (nothing changes then)."""
    statement = (
        insert(outbox_pauses)
        .values(outbox=job_name, paused_at=now, paused_by=actor[:300])
        .on_conflict_do_nothing(index_elements=[outbox_pauses.c.outbox])
        .returning(outbox_pauses.c.outbox)
    )
    return connection.execute(statement).first() is not None


def resume(connection: Connection, job_name: str) -> bool:
    """Resume ``job_name``'s drains; False if it was not paused."""
    statement = delete(outbox_pauses).where(outbox_pauses.c.outbox == job_name).returning(outbox_pauses.c.outbox)
    return connection.execute(statement).first() is not None


class PauseCheck:
    """A drainer's cached view of its outbox's pause (see the module).  Thread-safe."""

    def __init__(self, engine: Engine, job_name: str, *, cache_seconds: float = PAUSE_CACHE_SECONDS) -> None:
        self.engine = engine
        self.job_name = job_name
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._answer = False
        self._valid_until = float("-inf")
        self._missing_reported = False

    def paused(self) -> bool:
        with self._lock:
            if time.monotonic() < self._valid_until:
                return self._answer
        answer = self._read()
        with self._lock:
            self._answer, self._valid_until = answer, time.monotonic() + self.cache_seconds
        return answer

    def forget(self) -> None:
        """Drop the cached answer (a wake-up may follow a resume)."""
        with self._lock:
            self._valid_until = float("-inf")

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
