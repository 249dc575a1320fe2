"""Pending wake-ups: an insert notifies only when no wake-up of its outbox is pending already.

PostgreSQL queues a transaction's notifications at commit under one lock for
the whole server, held until the commit has been flushed: every transaction
that notifies commits after the previous one, one WAL flush each, and
producers that commit at once lose the group commit that batches their
flushes.  Measured with 16 producers of one row per transaction, an outbox
whose every insert notified took 0.12 of the rate of the same inserts into a
table without a trigger (docs/performance.md).  So an insert notifies only
when its outbox has no wake-up pending, and never loses one:

* **The insert** (the trigger's body, ``trigger_body``): it takes a shared
  transaction-level advisory lock on its outbox's key, held until it commits,
  then looks for a row of its channel in ``outboxkit_wakeups``.  None: it adds
  one and notifies.  One there: a wake-up is pending, and the insert does not
  notify.
* **The drain loop** (``clear``), before it claims once it has caught up:
  it takes the same key's lock exclusively, without waiting, and deletes the
  channel's rows.  It gets the lock only when no inserting transaction that
  took it is still open, so every insert that skipped its notification has
  committed, and the claim that follows (a statement of its own, with a new
  snapshot) sees its row.  An insert after the clear finds no row and notifies.
  When an inserting transaction is still open the clear fails; the loop then
  claims again within ``RECHECK_MAX_SECONDS`` and tries once more, so a row
  whose insert did not notify is claimed without waiting for the safety-net poll.

A row left by an insert the clear did not see (it committed after the clear's
snapshot) was notified by that insert, so it wakes the loop, which clears it.
Without the table (migration ``outboxkit_0018`` not yet run) the trigger
notifies on every insert, as before, and the loop clears nothing.
"""

from __future__ import annotations

import hashlib
import logging

from sqlalchemy import Connection, text
from sqlalchemy.exc import ProgrammingError

from outboxkit.storage.tables import outbox_wakeups
from outboxkit.telemetry.log_events import log_fields

__all__ = ["LOCK_CLASS", "RECHECK_MAX_SECONDS", "RECHECK_SECONDS", "Wakeups", "lock_key", "trigger_body"]

logger = logging.getLogger(__name__)

# The two-key advisory locks of pending wake-ups: (LOCK_CLASS, a channel's key).  The leader's one-key lock
# (a bigint) never meets them: PostgreSQL keeps the two forms apart.
LOCK_CLASS = 0x6F62_6B77  # "obkw"
# While an inserting transaction keeps the clear from taking its lock, the loop claims again this soon,
# doubling up to RECHECK_MAX_SECONDS (the longest a row whose insert did not notify can wait for its claim).
RECHECK_SECONDS = 0.005
RECHECK_MAX_SECONDS = 0.05

_TABLE = outbox_wakeups.name


def lock_key(channel: str) -> int:
    """The channel's advisory lock key (a signed 32-bit integer, stable across processes and versions)."""
    value = int.from_bytes(hashlib.sha256(channel.encode()).digest()[:4], "big")
    return value - (1 << 32) if value >= 1 << 31 else value


def trigger_body(channel: str) -> str:
    """The plpgsql body of an outbox's insert trigger (``outboxkit.storage.notify.install_trigger_sql``)."""
    quoted = channel.replace("'", "''")
    return f"""BEGIN
    IF to_regclass('{_TABLE}') IS NULL THEN
        PERFORM pg_notify('{quoted}', '');  -- migration outboxkit_0018 not run yet: every insert notifies
        RETURN NULL;
    END IF;
    -- Held until this transaction ends: the drain clears a pending wake-up only when no insert that
    -- relied on it is still open (outboxkit.storage.wakeups).
    PERFORM pg_advisory_xact_lock_shared({LOCK_CLASS}, {lock_key(channel)});
    IF NOT EXISTS (SELECT FROM {_TABLE} WHERE channel = '{quoted}') THEN
        INSERT INTO {_TABLE} (channel) VALUES ('{quoted}');
        PERFORM pg_notify('{quoted}', '');
    END IF;
    RETURN NULL;
END"""


_CLEAR = text(
    f"WITH locked AS (SELECT pg_try_advisory_xact_lock(:class, :key) AS taken), "
    f"cleared AS (DELETE FROM {_TABLE} WHERE channel = :channel AND (SELECT taken FROM locked)) "
    "SELECT taken FROM locked"
)


class Wakeups:
    """One outbox's pending wake-up, as its drain loop clears it (see the module docstring)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._parameters = {"class": LOCK_CLASS, "key": lock_key(channel), "channel": channel}
        self._warned = False

    def clear(self, connection: Connection) -> bool:
        """Delete the channel's pending wake-up; False while an inserting transaction is still open.

        ``connection`` is in AUTOCOMMIT: the statement is its own transaction, so its lock ends with it.
        """
        try:
            return bool(connection.execute(_CLEAR, self._parameters).scalar_one())
        except ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) != "42P01":  # undefined_table
                raise
            if not self._warned:  # tried again at each clear: the migration may run while this process lives
                self._warned = True
                logger.warning(
                    "%s is missing: every insert into an outbox notifies (run `alembic upgrade heads` for migration "
                    "outboxkit_0018)", _TABLE, extra=log_fields("notify.wakeups_table_missing"),
                )
            return True
