"""Jobs and leadership, read from the database.

The admin does not talk to the scheduler object: it reads what the scheduler
leaves behind, so it works in any worker, leader or not.

* **Runs** come from the kit's ``outboxkit_job_runs`` table.  A drain job's id
  is ``outboxkit.drain.<job_name>``; its last run is the outbox's heartbeat.
* **The leader** is the session that holds the election's advisory lock in
  this database: ``pg_locks`` joined to ``pg_stat_activity`` where
  ``application_name`` is ``outboxkit-leader:<host>:<pid>``.  ``pg_locks`` is
  cluster-wide, so the query always filters on the current database.  The
  admin's database role must be allowed to see other sessions'
  ``application_name`` (same role, or ``pg_read_all_stats``).
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

from outboxkit.scheduler import DRAIN_JOB_PREFIX, JobInfo

__all__ = ["DRAIN_JOB_PREFIX", "JobInfo", "JobRun", "JobSource", "Leader", "drain_job_id", "last_runs", "leaders"]

LEADER_APPLICATION_PREFIX = "outboxkit-leader:"


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


@dataclass(frozen=True, kw_only=True)
class Leader:
    """The session that holds the election lock."""

    host: str
    pid: int | None
    backend_pid: int
    application_name: str
    since: datetime | None


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

LEADERS = """
SELECT activity.application_name, activity.pid AS backend_pid, activity.backend_start
FROM pg_locks AS locks
JOIN pg_stat_activity AS activity ON activity.pid = locks.pid
WHERE locks.locktype = 'advisory'
  AND locks.granted
  AND locks.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND activity.application_name LIKE 'outboxkit-leader:%'
ORDER BY activity.backend_start
"""


def last_runs(connection: Connection, job_ids: list[str] | None = None) -> dict[str, JobRun]:
    """The last recorded run per job id: of the listed ids, or of every job in the history."""
    rows: Iterable[Any]
    if job_ids is not None:
        rows = connection.execute(text(LAST_RUNS_OF), {"job_ids": job_ids}) if job_ids else []
    else:
        rows = connection.execute(text(LAST_RUNS_OF_ALL))
    return {row.job_id: JobRun(**row._mapping) for row in rows}


def leaders(connection: Connection) -> list[Leader]:
    """Sessions holding an outboxkit election lock in this database (more than one means a bug)."""
    found = []
    for row in connection.execute(text(LEADERS)):
        host, pid = _parse_leader_name(row.application_name)
        found.append(
            Leader(
                host=host, pid=pid, backend_pid=row.backend_pid, application_name=row.application_name, since=row.backend_start
            )
        )
    return found


def _parse_leader_name(application_name: str) -> tuple[str, int | None]:
    """``outboxkit-leader:<host>:<pid>`` -> (host, pid); a host may itself hold colons."""
    rest = application_name[len(LEADER_APPLICATION_PREFIX) :]
    host, separator, pid = rest.rpartition(":")
    if separator and pid.isdigit():
        return host, int(pid)
    return rest, None
