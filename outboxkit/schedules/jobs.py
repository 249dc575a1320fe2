"""Scheduled jobs: their definitions and the discipline every run follows.

A job is a function of one ``JobContext`` (sync or ``async def``) that
returns counts (or None); a function that cannot be called that way is
refused when the job is registered::

    def expire_trials(context: JobContext) -> dict[str, int]:
        expired = context.session.execute(update(Trial)...).rowcount
        return {"expired": expired}  # the runner commits the session when the job returns

    kit.schedules.add_job("billing.expire-trials", expire_trials,
                          ScheduleTrigger.cron(timezone="Europe/Berlin", hour=3, minute=30))

Every run goes through ``JobRunner.run``, which

* takes the *fence* first: it inserts the occurrence (``job_id``,
  ``scheduled_for``) into ``outboxkit_job_runs`` with ``ON CONFLICT DO
  NOTHING`` and skips the run if the row was already there.  Two schedulers
  that both believe they lead (the short window of a lost lock) therefore
  cannot run one occurrence twice.  The fence is a committed row, not a
  lock: transaction-level advisory locks vanish at commit and guard nothing;
* gives the job a fresh ``Session``, commits it when the job returns and
  closes it in ``finally`` (which rolls back what a job that raised wrote);
* never lets an exception escape into APScheduler: it is logged with its
  traceback and recorded as the run's ``error``;
* records the run's end, outcome and counts, then trims the job's history to
  the newest ``history_limit`` finished runs (a run still in progress is never
  trimmed), so the admin can show a heartbeat.  The fence outlives the trim:
  the trim moves the job's high-water mark past every run it deletes
  (``outboxkit.schedules.fences``), so a trimmed occurrence never runs again;
* logs only when something happened (a non-zero count, an error, a skip).

A run whose scheduler died mid-run stays ``running``; the next scheduler to
start marks it ``abandoned`` (``JobRunner.abandon_unfinished``).  The
triggers (``cron``, ``every``, ``calendar_interval``, ``once``) live in
``outboxkit.schedules.triggers`` and are re-exported here; they are the
elected scheduler's form, which applications no longer use: a schedule takes
a ``ScheduleTrigger`` (``outboxkit.schedules.definitions``), built on them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from apscheduler.triggers.base import BaseTrigger
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from outboxkit.errors import ConfigurationError, JobFailed
from outboxkit.results import RunRecord
from outboxkit.schedules.fences import bound_idle, lock_fence_sql, take_fence_sql, trim_history_sql
from outboxkit.schedules.triggers import INTERVAL_ANCHOR, calendar_interval, cron, every, once
from outboxkit.telemetry.hooks import Telemetry, log_fields

__all__ = [
    "KIT_JOB_PREFIX",
    "JobContext",
    "JobFailed",
    "JobRunner",
    "INTERVAL_ANCHOR",
    "ScheduledJob",
    "calendar_interval",
    "cron",
    "every",
    "once",
]

# Job ids and schedule names under this prefix are the kit's own (drains, retention).
KIT_JOB_PREFIX = "outboxkit."

logger = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 4000
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What one run of a job gets: its identity, its fire time and a fresh session.

    ``session`` is this run's own ``Session`` on the kit's engine.  When the
    job returns, the runner commits it (a failed commit makes the run an
    ``error``); when the job raises, whatever it did not commit itself is
    rolled back.  A job may commit as it goes (``context.session.commit()``),
    for work in several transactions.  ``scheduled_for`` is the occurrence's fire
    time (the fence's key), ``leader`` the ``host:pid`` running it.
    """

    job_id: str
    job_name: str
    scheduled_for: datetime
    session: Session
    leader: str


# A job may be ``async def``: it then runs on a fresh event loop in the worker
# thread, never on the application's loop.
JobFunction = Callable[[JobContext], Mapping[str, int] | None | Awaitable[Mapping[str, int] | None]]


@dataclass(frozen=True, kw_only=True)
class ScheduledJob:
    """A job as registered: stable ``id`` and human ``name`` (monitors key on both), trigger, function.

    ``fenced=False`` is for runs that are not occurrences of a schedule (a
    drain woken by NOTIFY): they take no fence and are recorded after the fact.
    """

    id: str
    name: str
    trigger: BaseTrigger
    function: JobFunction
    fenced: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _JOB_ID.match(self.id):
            raise ConfigurationError(
                f"job id {self.id!r} must be 1-200 characters of letters, digits, '.', ':', '_' or '-' "
                "(e.g. 'billing.expire-trials')"
            )
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise ConfigurationError(f"job {self.id!r}: name must be 1-200 characters, got {self.name!r}")
        if not isinstance(self.trigger, BaseTrigger):
            raise ConfigurationError(
                f"job {self.id!r}: trigger must come from cron(), every(), calendar_interval() or once()"
            )
        check_job_function(self.id, self.function)


_JOB_SIGNATURE = "def job(context: JobContext) -> dict[str, int] | None (or async def)"


def check_job_function(job_id: str, function: object) -> None:
    """Refuse, at registration, a function that every run would fail to call (a ``ConfigurationError``).

    A job is called with exactly one positional argument, its ``JobContext``;
    it may be sync or async and may have further parameters with defaults.
    A function whose signature cannot be read (some builtins) is accepted.
    """
    if not callable(function):
        raise ConfigurationError(f"job {job_id!r}: the function must be callable, not {function!r}; {_JOB_SIGNATURE}")
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise ConfigurationError(
            f"job {job_id!r}: {_describe(function)} is a generator function; a job returns its counts: {_JOB_SIGNATURE}"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)  # stands for the JobContext
    except TypeError:
        raise ConfigurationError(
            f"job {job_id!r}: {_describe(function)}{signature} cannot be called with one JobContext; "
            f"expected {_JOB_SIGNATURE}"
        ) from None


def _describe(function: object) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


# -- running -----------------------------------------------------------------

# The fence (outboxkit.schedules.fences): the job's mark, then the occurrence's own history row.
_TAKE_FENCE = text(
    f"""
    WITH {take_fence_sql(":job_id")}
    INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, leader)
    SELECT :job_id, :job_name, :scheduled_for, clock_timestamp(), :leader FROM fence
    WHERE fence.fired_through < :scheduled_for
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id
    """
)
_FINISH = text(
    """
    UPDATE outboxkit_job_runs
    SET finished_at = clock_timestamp(), outcome = :outcome, counts = CAST(:counts AS jsonb), error = :error
    WHERE id = :run_id
    """
)
_RECORD_UNFENCED = text(
    """
    INSERT INTO outboxkit_job_runs
        (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader)
    VALUES (:job_id, :job_name, :scheduled_for, :started_at, clock_timestamp(), :outcome,
            CAST(:counts AS jsonb), :error, :leader)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    """
)
# Keeps the newest :keep finished runs of one job and every run still in progress (its outcome is written into
# it when it ends), and moves the job's fence past the runs deleted (outboxkit.schedules.fences).
_TRIM = text(f"WITH {lock_fence_sql(':job_id')}, {trim_history_sql(':job_id')} SELECT (SELECT count(*) FROM trimmed)")
# The record's first statement: the fence's lock, before the run's row is written (outboxkit.schedules.fences).
_LOCK_FENCE = text(f"WITH {lock_fence_sql(':job_id')} SELECT count(*) FROM fence_lock")


# Runs of the listed jobs that are still 'running' when a scheduler starts.
# The lock is exclusive and a new leader starts one leader tick after taking
# it, when any previous leader has stopped scheduling: such a run was started
# by an earlier scheduler that was killed, or that lost the lock and is still
# finishing it.  The second kind records its real outcome over this one.
_ABANDON = text(
    """
    UPDATE outboxkit_job_runs
    SET outcome = 'abandoned',
        error = format(
            'the run never finished: the scheduler that started it (%s) was killed, stopped or lost '
            'the leader lock mid-run; marked abandoned by %s when it started the schedule',
            leader, CAST(:by AS text))
    WHERE outcome = 'running' AND job_id = ANY(CAST(:job_ids AS text[]))
    RETURNING job_name, scheduled_for, leader
    """
)


class JobRunner:
    """Runs one occurrence of a job under the fence and records it.  ``run`` never raises."""

    def __init__(
        self, engine: Engine, *, leader: Callable[[], str], history_limit: int = 200, telemetry: Telemetry | None = None
    ) -> None:
        self.engine = engine
        self._leader = leader
        self.history_limit = history_limit
        self.telemetry = telemetry if telemetry is not None else Telemetry()  # job-run metrics; no-op unless attached

    def run(self, job: ScheduledJob, *, scheduled_for: datetime) -> RunRecord:
        started = time.monotonic()
        record = self._run(job, scheduled_for=scheduled_for)
        self.telemetry.job_finished(job.id, job.name, record, time.monotonic() - started)
        return record

    def _run(self, job: ScheduledJob, *, scheduled_for: datetime) -> RunRecord:
        leader = self._leader()
        try:
            run_id = None
            if job.fenced:
                with self.engine.begin() as connection:
                    bound_idle(connection)
                    run_id = connection.execute(
                        _TAKE_FENCE,
                        {"job_id": job.id, "job_name": job.name, "scheduled_for": scheduled_for, "leader": leader},
                    ).scalar()
                if run_id is None:
                    logger.warning(
                        "%s: the run scheduled for %s was already taken by another scheduler; skipped",
                        job.name,
                        scheduled_for.isoformat(),
                        extra=log_fields("job.skipped", job=job.id),
                    )
                    return RunRecord(outcome="skipped", counts={})
            started_at = datetime.now(timezone.utc)
            record = self.call(job.id, job.name, job.function, scheduled_for=scheduled_for, leader=leader)
            values = {
                "outcome": record.outcome,
                "counts": json.dumps(record.counts),
                "error": record.error,
            }
            with self.engine.begin() as connection:
                bound_idle(connection)
                connection.execute(_LOCK_FENCE, {"job_id": job.id})
                if run_id is not None:
                    connection.execute(_FINISH, {**values, "run_id": run_id})
                else:
                    connection.execute(
                        _RECORD_UNFENCED,
                        {
                            **values,
                            "job_id": job.id,
                            "job_name": job.name,
                            "scheduled_for": scheduled_for,
                            "started_at": started_at,
                            "leader": leader,
                        },
                    )
                self.trim_history(connection, job.id)
            return record
        except Exception as exc:  # the history table is unreachable: the job itself has run or will run again
            logger.error("%s: could not record the run scheduled for %s: %s", job.name, scheduled_for.isoformat(), exc,
                         extra=log_fields("job.record_failed", job=job.id))
            return RunRecord(outcome="error", counts={}, error=f"{type(exc).__name__}: {exc}")

    def abandon_unfinished(self, job_ids: list[str]) -> int:
        """Mark these jobs' runs still ``running`` as ``abandoned``; call before a scheduler starts.

        Returns how many rows were marked; never raises (a failure is logged,
        and only leaves those rows ``running``).  The rows keep their fence,
        so an abandoned occurrence is not run again.
        """
        by = self._leader()
        try:
            with self.engine.begin() as connection:
                abandoned = connection.execute(_ABANDON, {"job_ids": job_ids, "by": by}).all()
        except Exception as exc:
            logger.warning(
                "could not mark unfinished runs as abandoned (%s); if the error names "
                "ck_outboxkit_job_runs_outcome, run the kit's migrations (alembic upgrade heads)",
                exc,
                extra=log_fields("job.abandon_failed"),
            )
            return 0
        for job_name, scheduled_for, leader in abandoned:
            logger.warning(
                "%s: the run scheduled for %s, started by %s, never finished; marked abandoned",
                job_name,
                scheduled_for.isoformat(),
                leader,
                extra=log_fields("job.abandoned", job_name=job_name, scheduled_for=scheduled_for.isoformat(), started_by=leader),
            )
        return len(abandoned)

    def trim_history(self, connection: Connection, job_id: str) -> None:
        """Keep the newest ``history_limit`` finished runs of ``job_id`` and its runs in progress, in the caller's
        transaction."""
        connection.execute(_TRIM, {"job_id": job_id, "keep": self.history_limit})

    def call(
        self, job_id: str, job_name: str, function: JobFunction, *, scheduled_for: datetime, leader: str
    ) -> RunRecord:
        """Call a job's function once, with a fresh session, outside any fence; never raises.

        The function's counts make an ``ok`` record once its session is
        committed; an exception (or a ``JobFailed``, or a failed commit) an
        ``error`` one, logged, with the session rolled back.  Recording it is
        the caller's.
        """
        session = Session(self.engine)
        try:
            context = JobContext(job_id=job_id, job_name=job_name, scheduled_for=scheduled_for, session=session, leader=leader)
            returned: object = function(context)
            if inspect.isawaitable(returned):  # an async job gets its own event loop, in this worker thread
                returned = asyncio.run(_await(returned))
            counts = _counts(returned)
            session.commit()  # what the job wrote is kept when it returns; closing below rolls back a job that raised
        except JobFailed as exc:
            logger.log(logging.DEBUG if exc.quiet else logging.ERROR, "%s: %s", job_name, exc,
                       extra=log_fields("job.failed", job=job_id))
            return RunRecord(outcome="error", counts={}, error=str(exc)[:ERROR_TEXT_LIMIT])
        except Exception as exc:
            logger.error("%s: the job raised\n%s", job_name, traceback.format_exc().rstrip(),
                         extra=log_fields("job.failed", job=job_id))
            return RunRecord(outcome="error", counts={}, error=f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT])
        finally:
            session.close()
        if any(counts.values()):
            logger.info("%s: %s", job_name, ", ".join(f"{key} {value}" for key, value in counts.items() if value),
                        extra=log_fields("job.counts", job=job_id, counts=counts))
        return RunRecord(outcome="ok", counts=counts)


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _counts(value: object) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and isinstance(count, int) and not isinstance(count, bool) for key, count in value.items()
    ):
        raise JobFailed(f"a job returns a mapping of str to int counts (or None), not {value!r}")
    return dict(value)
