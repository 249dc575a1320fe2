"""Jobs and leadership, read from the database.

The admin does not talk to the scheduler object: it reads what the scheduler
leaves behind, so it works in any worker, leader or not.

* **Runs** come from the kit's ``outboxkit_job_runs`` table.  A drain job's id
  is ``outboxkit.drain.<job_name>``; its last run is the outbox's heartbeat.
* **The leader** is the session that holds the election's advisory lock (the
  kit's ``advisory_lock_key``) in this database: ``pg_locks`` joined to
  ``pg_stat_activity``, whose ``application_name``
  ``outboxkit-leader:<host>:<pid>`` says which process it is
  (``outboxkit.leader.lock.lock_holders``, the election's own statement).
  ``pg_locks`` is cluster-wide, so the query always filters on the current
  database.  The admin's database role must be allowed to see other
  sessions' ``application_name`` (same role, or ``pg_read_all_stats``);
  without it host and pid are unknown.
* **Scheduled jobs** (trigger, next run) exist only in the leader's memory.
  An application that wants them on the page passes a ``JobSource``; without
  one the page lists the jobs seen in the run history.

The ``JobSource`` contract is deliberately small, so any scheduler can provide
it::

    class SchedulerJobs:
        def jobs(self) -> list[JobInfo]:
            return [JobInfo(id=job.id, name=job.name, trigger=str(job.trigger),
                            next_run_at=job.next_run_time) for job in scheduler.get_jobs()]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import Connection, text

from outboxkit.leader.lock import LockHolder, lock_holders
from outboxkit.leader.scheduler import DRAIN_JOB_PREFIX, JobInfo

__all__ = ["DRAIN_JOB_PREFIX", "JobInfo", "JobRun", "JobSource", "LockHolder", "drain_job_id", "last_runs", "leaders"]


def drain_job_id(job_name: str) -> str:
    """The scheduler's job id for an outbox's drain, e.g. ``outboxkit.drain.credit-grants``."""
    return DRAIN_JOB_PREFIX + job_name


@runtime_checkable
class JobSource(Protocol):
    """Anything that lists the scheduled jobs.  Called once per jobs page; may raise (shown, not fatal)."""

    def jobs(self) -> list[JobInfo]: ...


@dataclass(frozen=True, kw_only=True)
class JobRun:
    """One recorded run of a job."""

    job_id: str
    job_name: str
    scheduled_for: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    counts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    leader: str = ""


_RUN_COLUMNS = "job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader"

# The last run of each listed job: one index probe per id on
# (job_id, started_at), however long the history is.
LAST_RUNS_OF = f"""
SELECT last.* FROM unnest(CAST(:job_ids AS text[])) AS wanted(job_id)
CROSS JOIN LATERAL (
    SELECT {_RUN_COLUMNS} FROM outboxkit_job_runs AS runs
    WHERE runs.job_id = wanted.job_id ORDER BY started_at DESC LIMIT 1
) AS last
"""

# Every job id in the history, by a loose index scan (one probe per distinct
# id instead of reading the whole table), then each one's last run.
LAST_RUNS_OF_ALL = f"""
WITH RECURSIVE ids AS (
    (SELECT job_id FROM outboxkit_job_runs ORDER BY job_id LIMIT 1)
    UNION ALL
    SELECT (SELECT job_id FROM outboxkit_job_runs WHERE job_id > ids.job_id ORDER BY job_id LIMIT 1)
    FROM ids WHERE ids.job_id IS NOT NULL
)
SELECT last.* FROM ids
CROSS JOIN LATERAL (
    SELECT {_RUN_COLUMNS} FROM outboxkit_job_runs AS runs
    WHERE runs.job_id = ids.job_id ORDER BY started_at DESC LIMIT 1
) AS last
WHERE ids.job_id IS NOT NULL
ORDER BY last.job_id
"""

def last_runs(connection: Connection, job_ids: list[str] | None = None) -> dict[str, JobRun]:
    """The last recorded run per job id: of the listed ids, or of every job in the history."""
    rows: Iterable[Any]
    if job_ids is not None:
        rows = connection.execute(text(LAST_RUNS_OF), {"job_ids": job_ids}) if job_ids else []
    else:
        rows = connection.execute(text(LAST_RUNS_OF_ALL))
    return {row.job_id: JobRun(**row._mapping) for row in rows}


def leaders(connection: Connection, *, key: int) -> list[LockHolder]:
    """Sessions holding the kit's election lock (``key``) in this database: more than one means a bug.

    The same statement as the election's own look-up (``outboxkit.leader.lock.lock_holders``): the
    advisory key and the database must match, so a session of another application that only shares the
    ``outboxkit-leader:`` name, or holds another advisory lock, is not counted.
    """
    return lock_holders(connection, key=key)
