"""What happened, read from the kit's history tables: attempts of a row, runs of a job.

* ``row_attempts``: a row's attempts from ``outboxkit_attempts``, newest
  first (one probe of the (outbox, row_id, attempt) index), each with what it
  sent and got back (redacted when recorded), and the markers its resets
  left.  They outlive a reset, so the reason a row got stuck is still there
  after it was reset; the numbers count on across resets.
* ``job_run_history``: a job's last runs from ``outboxkit_job_runs``, newest
  first, and ``job_failure_counts``: how many of each job's kept runs failed
  (error or abandoned), over the history the scheduler keeps
  (``job_history_limit`` runs per job).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

__all__ = ["AttemptEntry", "job_failure_counts", "job_run_history", "row_attempts"]

ROW_ATTEMPTS_LIMIT = 100


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptEntry:
    attempt: int
    started_at: datetime
    finished_at: datetime
    outcome: str
    status_code: int | None
    error: str | None
    sender: str
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None

    @property
    def duration_ms(self) -> float:
        return (self.finished_at - self.started_at).total_seconds() * 1000


ROW_ATTEMPTS = """
SELECT attempt, started_at, finished_at, outcome, status_code, error, sender, request, response FROM outboxkit_attempts
WHERE outbox = :outbox AND row_id = :row_id
ORDER BY finished_at DESC, id DESC LIMIT :limit
"""

JOB_RUNS = """
SELECT job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader FROM outboxkit_job_runs
WHERE job_id = :job_id ORDER BY started_at DESC LIMIT :limit
"""

# One index range per job on (job_id, started_at): the history is bounded per job.
FAILURE_COUNTS = """
SELECT wanted.job_id,
       (SELECT count(*) FROM outboxkit_job_runs AS runs
        WHERE runs.job_id = wanted.job_id AND runs.outcome IN ('error', 'abandoned')) AS failures,
       (SELECT count(*) FROM outboxkit_job_runs AS runs WHERE runs.job_id = wanted.job_id) AS runs
FROM unnest(CAST(:job_ids AS text[])) AS wanted(job_id)
"""


def row_attempts(connection: Connection, outbox: str, row_id: int, *, limit: int = ROW_ATTEMPTS_LIMIT) -> list[AttemptEntry]:
    """A row's recorded attempts and reset markers, newest first."""
    rows = connection.execute(text(ROW_ATTEMPTS), {"outbox": outbox, "row_id": row_id, "limit": limit})
    return [AttemptEntry(**row._mapping) for row in rows]


def job_run_history(connection: Connection, job_id: str, *, limit: int) -> list[dict[str, Any]]:
    """A job's last ``limit`` runs, newest first."""
    return [dict(row._mapping) for row in connection.execute(text(JOB_RUNS), {"job_id": job_id, "limit": limit})]


def job_failure_counts(connection: Connection, job_ids: list[str]) -> dict[str, tuple[int, int]]:
    """``{job_id: (failed runs, kept runs)}`` over the kept history."""
    if not job_ids:
        return {}
    rows = connection.execute(text(FAILURE_COUNTS), {"job_ids": job_ids})
    return {row.job_id: (row.failures, row.runs) for row in rows}
