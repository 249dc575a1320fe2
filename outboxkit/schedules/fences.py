"""The fence: what proves that an occurrence of a job already fired, kept apart from the capped run history.

An occurrence ``(job, fire time)`` fires once: whoever fires it first takes
its fence, and a second taker (a process that claimed it late, a second
scheduler in the short window of a lost leader lock, a hand-run of that
occurrence) finds the fence taken and skips it.  The run history
(``outboxkit_job_runs``) is trimmed to the newest runs of each job, so it
cannot be the whole fence: a late taker would find a trimmed occurrence free.

So the fence has two parts:

* per job, a *high-water mark* (``outboxkit_job_fences.fired_through``):
  every occurrence at or before it counts as fired.  The trim moves it past
  every run it deletes, in the same statement, so trimming never frees an
  occurrence;
* each newer occurrence's own history row (the unique ``(job_id,
  scheduled_for)``), as before, so an occurrence after the mark fires once
  whatever order occurrences are taken in (a "run now", a hand-run of a past
  occurrence).

A take and a trim of one job never interleave: each first locks the job's
fence row (the take creates it), so a take waits for a trim that is
deleting the very row it would conflict with, and then reads the mark that
trim left.  Every write of a job's run that may wait for a take takes that
lock before it touches a run row, so the two never wait for each other
(a deadlock).  Both pieces are CTEs joined into their callers' single
statements: the take in ``outboxkit.schedules.claims`` and
``outboxkit.schedules.jobs``, the trim in ``outboxkit.schedules.runs`` and
``outboxkit.schedules.jobs``.

A process stopped inside one of those transactions (SIGSTOP, a paused VM, a
debugger) would hold the fence row, and every other runner of the job would
wait on it for as long as the process stays stopped.  So each transaction
that may take or lock a fence first calls ``bound_idle``: the server ends a
session that sits idle inside it for ``FROZEN_HOLDER_SECONDS`` (PostgreSQL's
``idle_in_transaction_session_timeout``, set for that transaction only), the
lock goes with it and the others go on.  The stopped process finds its
transaction gone when it resumes: a take it had not committed was never
taken, a record it had not committed is reported as a failed record.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

__all__ = [
    "FROZEN_HOLDER_SECONDS",
    "LOCK_FENCE",
    "TAKE_FENCE",
    "TRIM_HISTORY",
    "bound_idle",
    "lock_fence_sql",
    "take_fence_sql",
    "trim_history_sql",
]

# How long a session may sit idle inside a fence transaction before the server ends it.  Those transactions send
# their few statements back to back, so only a stopped process idles there this long.
FROZEN_HOLDER_SECONDS = 5.0

_BOUND_IDLE = text("SELECT set_config('idle_in_transaction_session_timeout', :timeout, true)")

# Lock (or create) the job's fence row and read its mark; the take's INSERT selects FROM fence WHERE it is before
# the occurrence.  The no-op DO UPDATE takes the row lock and returns the mark as the lock holder committed it.
TAKE_FENCE = """fence AS (
    INSERT INTO outboxkit_job_fences AS fenced (job_id, fired_through) VALUES ({job_id}, '-infinity')
    ON CONFLICT (job_id) DO UPDATE SET fired_through = fenced.fired_through
    RETURNING fired_through
)"""

# Lock the job's fence row, first in any statement that writes the job's runs: every write of a run waits for
# the lock before it touches a row, as a take does, so a take waiting on a run row never holds what the write needs.
# A statement reads it as ``WHERE (SELECT count(*) FROM fence_lock) >= 0`` (a one-time filter, run before its scan).
LOCK_FENCE = """fence_lock AS (
    SELECT fired_through FROM outboxkit_job_fences WHERE job_id = {job_id} FOR UPDATE
)"""

# Keep the newest :keep finished runs of the job (the cut-off is the :keep-th newest of {kept}) and every run in
# progress, and move the job's mark past every run deleted; after LOCK_FENCE in the same WITH.  Served by
# (job_id, started_at).
TRIM_HISTORY = """trimmed AS (
    DELETE FROM outboxkit_job_runs
    WHERE (SELECT count(*) FROM fence_lock) >= 0
      AND job_id = {job_id} AND outcome <> 'running' AND started_at < (
        SELECT started_at FROM outboxkit_job_runs WHERE job_id = {job_id} AND ({kept})
        ORDER BY started_at DESC OFFSET :keep - 1 LIMIT 1){also}
    RETURNING id, scheduled_for
), fence_moved AS (
    INSERT INTO outboxkit_job_fences AS fenced (job_id, fired_through)
    SELECT {job_id}, max(scheduled_for) FROM trimmed HAVING count(*) > 0
    ON CONFLICT (job_id) DO UPDATE SET fired_through = greatest(fenced.fired_through, EXCLUDED.fired_through)
)"""


def take_fence_sql(job_id: str) -> str:
    """The take's CTE (without ``WITH``) for the job named by the SQL expression ``job_id`` (a parameter)."""
    return TAKE_FENCE.format(job_id=job_id)


def lock_fence_sql(job_id: str) -> str:
    """The lock's CTE (without ``WITH``) for the job named by the SQL expression ``job_id``; it comes first."""
    return LOCK_FENCE.format(job_id=job_id)


def trim_history_sql(job_id: str, *, kept: str = "outcome <> 'running'", also: str = "") -> str:
    """The trim's CTEs (without ``WITH``, after ``lock_fence_sql``): ``kept`` says which runs count toward the :keep
    newest, ``also`` adds to the DELETE's condition."""
    return TRIM_HISTORY.format(job_id=job_id, kept=kept, also=also)


def bound_idle(connection: Connection) -> None:
    """Let the server end this transaction's session if it sits idle in it for ``FROZEN_HOLDER_SECONDS``; call it
    first in every transaction that takes or locks a fence."""
    connection.execute(_BOUND_IDLE, {"timeout": f"{int(FROZEN_HOLDER_SECONDS * 1000)}ms"})
