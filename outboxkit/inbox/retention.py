"""Pruning the inbox: records older than the retention window go, nothing inside it.

A record must outlive every redelivery of its message: while a sender may
still retry a message, its record is what turns the retry into a dropped
duplicate.  So the window (``OUTBOXKIT_INBOX_RETENTION_DAYS``) must exceed the
sender's longest retry schedule (for outboxkit's default backoff, 24
attempts over about 18.4 hours); a week is a safe start.

``prune_inbox`` deletes records whose ``received_at`` is before the cutoff, in
batches of ``batch_size`` on the ``received_at`` index, each batch its own
short transaction (AUTOCOMMIT), until none is left or ``max_rows`` or
``max_seconds`` is reached.  The DELETE re-checks the cutoff itself, so a
record inside the window is never deleted.  The counts in
``outboxkit_inbox_sources`` are not pruned.

With the setting on, the elected leader runs ``inbox_retention_job`` every
hour (id ``outboxkit.retention.inbox``); its run history records
``{"deleted": n}``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

from outboxkit.clock import Clock
from outboxkit.errors import ConfigurationError
from outboxkit.schedules.jobs import JobContext, ScheduledJob, every

__all__ = ["INBOX_RETENTION_JOB_ID", "inbox_retention_job", "prune_inbox"]

INBOX_RETENTION_JOB_ID = "outboxkit.retention.inbox"
RETENTION_INTERVAL_SECONDS = 3600.0

_DELETE_BATCH = text(
    """
    DELETE FROM outboxkit_inbox
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM outboxkit_inbox WHERE received_at < :cutoff ORDER BY received_at LIMIT :batch
    ))
      AND received_at < :cutoff
    """
)


def prune_inbox(
    engine: Engine, *, older_than: datetime, batch_size: int = 1000, max_rows: int = 500_000, max_seconds: float = 300.0
) -> int:
    """Delete inbox records received before ``older_than``, ``batch_size`` per statement; return how many.

    A run stops after ``max_rows`` deletions or ``max_seconds``; the rest goes in the next run.
    """
    if not isinstance(older_than, datetime) or older_than.tzinfo is None:
        raise ConfigurationError("prune_inbox: older_than must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    for name, value in (("batch_size", batch_size), ("max_rows", max_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"prune_inbox: {name} must be a positive integer, got {value!r}")
    deadline = time.monotonic() + max_seconds
    deleted = 0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        while deleted < max_rows and time.monotonic() < deadline:
            batch = min(batch_size, max_rows - deleted)
            count = connection.execute(_DELETE_BATCH, {"cutoff": older_than, "batch": batch}).rowcount
            deleted += count
            if count < batch:
                break
    return deleted


def inbox_retention_job(engine: Engine, clock: Clock, *, retention_days: float) -> ScheduledJob:
    """The hourly job that prunes inbox records older than ``retention_days`` (by ``clock``)."""
    if not retention_days > 0:
        raise ConfigurationError(f"inbox retention must be a positive number of days, got {retention_days!r}")
    window = timedelta(days=retention_days)

    def apply_retention(context: JobContext) -> dict[str, int]:
        return {"deleted": prune_inbox(engine, older_than=clock.now() - window)}

    return ScheduledJob(
        id=INBOX_RETENTION_JOB_ID,
        name="inbox-retention",
        trigger=every(seconds=RETENTION_INTERVAL_SECONDS),
        function=apply_retention,
    )
