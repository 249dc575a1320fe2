"""The partitions job of a partitioned outbox: partitions created ahead, and retention by dropping whole partitions.

Every outbox declared with ``OutboxOptions(partition_by="day" | "week")`` gets one job on the leader, id
``outboxkit.partitions.<job_name>``, name ``<job_name>-partitions``, every hour.  One
run:

* creates each partition of the current interval and the ``partitions_ahead`` intervals after it that
  does not exist yet (``outboxkit.storage.partitions.create_partition``), moving into it the rows the
  DEFAULT partition took for its range.  With the default margin of four intervals, the job can miss
  days (daily) or weeks (weekly) of runs before a row lands in the DEFAULT partition, and even then the
  insert succeeds and the next run moves it;
* with ``retain_done_for`` set, drops each partition whose whole range ended before ``now -
  retain_done_for`` and in which every row is ``done`` (``drop_partition_if_done``: the look and the drop
  under one lock, so a row reset or replayed meanwhile keeps its partition).  A partition holding a
  ``pending`` or ``stuck`` row stays whole, its ``done`` rows included, until that row is delivered and a
  later run finds it done.  Age is the partition's range (when its rows were created), not each row's
  ``delivered_at``: the row-by-row retention of a plain outbox is not run on a partitioned one;
* returns ``{"created": n, "moved_from_default": m, "dropped": d, "kept_unfinished": k}``, which the run
  history records; a lock not granted in time is skipped and counted in ``skipped``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox
from outboxkit.schedules.jobs import JobContext, ScheduledJob, every
from outboxkit.storage.partitions import (
    DEFAULT_LOCK_TIMEOUT_SECONDS,
    PartitionTable,
    create_partition,
    drop_partition_if_done,
    overlaps,
    partitions,
    wanted_ranges,
)

if TYPE_CHECKING:
    from datetime import datetime

    from outboxkit.drain.kit_core import KitCore

__all__ = ["PARTITIONS_INTERVAL_SECONDS", "drop_done_partitions", "ensure_partitions", "partitions_job", "partitions_job_id"]

PARTITIONS_JOB_PREFIX = "outboxkit.partitions."
PARTITIONS_INTERVAL_SECONDS = 3600.0


def partitions_job_id(outbox: type[Outbox]) -> str:
    """The stable scheduler id of an outbox's partitions job: ``outboxkit.partitions.<job_name>``."""
    return f"{PARTITIONS_JOB_PREFIX}{outbox.__outbox__.job_name}"


def ensure_partitions(
    engine: Engine, outbox: type[Outbox], *, now: datetime, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
) -> dict[str, int]:
    """Create the partitions ``outbox`` should have at ``now`` and does not; return what was done."""
    table = PartitionTable(outbox)
    created = moved = skipped = 0
    for wanted in wanted_ranges(outbox, now):
        with engine.connect() as connection:
            existing = partitions(connection, table)
        if overlaps(wanted, existing):  # made already, or inside a converted table's first partition
            continue
        result = create_partition(engine, table, wanted, lock_timeout=lock_timeout)
        if result is None:
            skipped += 1
        else:
            created, moved = created + 1, moved + result
    return {"created": created, "moved_from_default": moved, "skipped": skipped}


def drop_done_partitions(
    engine: Engine, outbox: type[Outbox], *, older_than: datetime, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_SECONDS
) -> dict[str, int]:
    """Drop every partition of ``outbox`` whose range ended by ``older_than`` and whose rows are all ``done``."""
    table = PartitionTable(outbox)
    with engine.connect() as connection:
        candidates = [
            partition for partition in partitions(connection, table)
            if not partition.is_default and partition.end is not None and partition.end <= older_than
        ]
    dropped = kept = skipped = 0
    for partition in candidates:
        outcome = drop_partition_if_done(engine, table, partition, lock_timeout=lock_timeout)
        if outcome is None:
            skipped += 1
        elif outcome:
            dropped += 1
        else:
            kept += 1
    return {"dropped": dropped, "kept_unfinished": kept, "skipped": skipped}


def partitions_job(kit: KitCore, outbox: type[Outbox]) -> ScheduledJob:
    """The scheduled job that keeps one partitioned outbox's partitions (hourly): ahead, and retention."""
    options = kit.options(outbox)
    if options.partition_by is None:
        raise ConfigurationError(f"outbox {options.job_name!r} is not partitioned (partition_by=None)")
    retain_for = options.retain_done_for

    def keep_partitions(context: JobContext) -> dict[str, int]:
        now = kit.clock.now()
        done = ensure_partitions(kit.engine, outbox, now=now)
        if retain_for is None:
            return {**done, "dropped": 0, "kept_unfinished": 0}
        dropped = drop_done_partitions(kit.engine, outbox, older_than=now - timedelta(seconds=retain_for))
        return {**done, **dropped, "skipped": done["skipped"] + dropped["skipped"]}

    return ScheduledJob(
        id=partitions_job_id(outbox),
        name=f"{options.job_name}-partitions",
        trigger=every(seconds=PARTITIONS_INTERVAL_SECONDS),
        function=keep_partitions,
    )
