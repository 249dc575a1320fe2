"""Retention of delivered rows: an opt-in job that deletes old ``done`` rows.

Off by default: the kit keeps every row forever.  An outbox opts in with
``OutboxOptions(retain_done_for=seconds)`` (or the per-environment override
``OUTBOXKIT_OUTBOXES__<KEY>__RETAIN_DONE_FOR``); the scheduler then runs one
job per such outbox, id ``outboxkit.retention.<job_name>``, name
``<job_name>-retention``, every hour on the leader.  A partitioned outbox
(``partition_by``) has none: its partitions job drops whole partitions
instead (``outboxkit.leader.partitions``).

What one run does, and which rule each step keeps:

* it deletes only rows whose ``status`` is ``done`` and whose
  ``delivered_at`` is older than ``now - retain_done_for``; the DELETE itself
  re-checks both under the row lock, so a ``pending`` or ``stuck`` row is
  never deleted, whatever happened since it was read;
* it walks the table in id order, ``batch_size`` rows per statement, each
  statement its own short transaction (AUTOCOMMIT): no long transaction holds
  back vacuum, and row locks are held for one batch at a time (claims never
  wait on them: they lock only pending rows);
* it stops when a window holds no row created before the cutoff (ids grow
  with time, so every later row is younger still), at the end of the table,
  after ``max_rows`` deletions or after ``max_seconds``; what is left goes
  in the next run;
* it also deletes the outbox's destination states that have said nothing
  for the same period (healthy, no failure run, no slow-down running,
  unchanged since the cutoff: ``DestinationStore.prune_quiet``), at most
  ``max_rows`` of them; a destination without a state is healthy, so
  nothing is lost but an old error text;
* it returns ``{"deleted": n, "destination_states_pruned": m}``, which the
  run history (``outboxkit_job_runs``) records.

Why a primary-key walk and not an index on ``delivered_at``: such an index
costs every delivery one more index insert, for a job that runs once an
hour; the walk reads only the oldest part of the table, where the rows to
delete are (docs/performance.md, "Retention", has the measurements).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from outboxkit.destinations.store import DestinationStore
from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox
from outboxkit.schedules.jobs import JobContext, ScheduledJob, every
from outboxkit.storage.operator_queries import admin_queries_for
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore

__all__ = [
    "RETENTION_INTERVAL_SECONDS",
    "RetentionLimits",
    "delete_delivered_rows",
    "retention_job",
    "retention_job_id",
]

logger = logging.getLogger(__name__)

RETENTION_JOB_PREFIX = "outboxkit.retention."
RETENTION_INTERVAL_SECONDS = 3600.0


@dataclass(frozen=True, kw_only=True)
class RetentionLimits:
    """How much one retention run may do.

    ``batch_size`` rows are read (and at most that many deleted) per
    statement; a run stops after ``max_rows`` deletions or ``max_seconds``.
    """

    batch_size: int = 1000
    max_rows: int = 500_000
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"retention {name} must be a positive integer, got {value!r}")
        if isinstance(self.max_seconds, bool) or not isinstance(self.max_seconds, (int, float)) or not self.max_seconds > 0:
            raise ConfigurationError(f"retention max_seconds must be a positive number, got {self.max_seconds!r}")


def retention_job_id(outbox: type[Outbox]) -> str:
    """The stable scheduler id of an outbox's retention job: ``outboxkit.retention.<job_name>``."""
    return f"{RETENTION_JOB_PREFIX}{outbox.__outbox__.job_name}"


def delete_delivered_rows(
    engine: Engine,
    outbox: type[Outbox],
    *,
    older_than: datetime,
    limits: RetentionLimits | None = None,
) -> int:
    """Delete ``done`` rows of ``outbox`` delivered before ``older_than``, in batches; return how many.

    Never deletes a ``pending`` or ``stuck`` row.  Each batch commits on its
    own, so a run cut short (a limit, an error) keeps what it did.
    """
    limits = limits or RetentionLimits()
    queries = admin_queries_for(outbox)
    deadline = time.monotonic() + limits.max_seconds
    deleted, after_id = 0, 0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        while deleted < limits.max_rows and time.monotonic() < deadline:
            window = min(limits.batch_size, limits.max_rows - deleted)
            batch = queries.delete_delivered_batch(connection, cutoff=older_than, after_id=after_id, window=window)
            deleted += batch.deleted
            if not batch.more_may_follow:
                break
            assert batch.last_id is not None  # more_may_follow implies a last id
            after_id = batch.last_id
        else:
            logger.info(
                "%s: retention stopped at its limit (%d rows, %g s) after deleting %d; the rest goes in the next run",
                outbox.__outbox__.job_name, limits.max_rows, limits.max_seconds, deleted,
                extra=log_fields("retention.limit_reached", outbox.__outbox__.job_name, deleted=deleted),
            )
    return deleted


def retention_job(kit: KitCore, outbox: type[Outbox]) -> ScheduledJob:
    """The scheduled job that applies ``retain_done_for`` to one outbox (hourly).

    The period comes from the kit's effective options (class options with
    the settings applied), the cutoff from the kit's clock; an outbox
    without a period has no retention job.
    """
    options = kit.options(outbox)
    retain_for = options.retain_done_for
    if retain_for is None:
        raise ConfigurationError(f"outbox {options.job_name!r} keeps delivered rows forever (retain_done_for=None)")

    def apply_retention(context: JobContext) -> dict[str, int]:
        now = kit.clock.now()
        cutoff = now - timedelta(seconds=retain_for)
        deleted = delete_delivered_rows(kit.engine, outbox, older_than=cutoff)
        with kit.engine.begin() as connection:
            pruned = DestinationStore(outbox).prune_quiet(
                connection, untouched_since=cutoff, now=now, limit=RetentionLimits().max_rows
            )
        return {"deleted": deleted, "destination_states_pruned": pruned}

    return ScheduledJob(
        id=retention_job_id(outbox),
        name=f"{options.job_name}-retention",
        trigger=every(seconds=RETENTION_INTERVAL_SECONDS),
        function=apply_retention,
    )
