"""The operator's table of jobs: every job with its schedule in words, last run, failures and pause; one job's runs.

The jobs come from a ``JobSource`` (the kit's scheduler, or any object with
``jobs()``); without one, the drain job of every outbox is listed anyway and
other jobs once they have run (from the run history).  A job source that
fails, or returns something that is not a job, does not take the table down:
the failure is shown with the table built from the run history.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from outboxkit.errors import InvalidTypeError, UnknownJobError
from outboxkit.kit import OutboxKit
from outboxkit.operations.history import job_failure_counts, job_run_history
from outboxkit.operations.job_status import DRAIN_JOB_PREFIX, JobInfo, JobRun, JobSource, drain_job_id, last_runs, leaders
from outboxkit.operations.schemas import JobEntry, JobRunsView, JobsView, LeaderModel, RunModel
from outboxkit.operations.trigger_words import describe_trigger
from outboxkit.schedules.jobs import every
from outboxkit.storage.pauses import Pause, paused_outboxes

__all__ = ["JobsTable", "run_model"]


class JobsTable:
    """The jobs of one kit as the operator sees them (``OperationsService.jobs`` and ``job_runs``)."""

    def __init__(self, kit: OutboxKit, job_source: JobSource | None) -> None:
        self.kit = kit
        self.job_source = job_source

    @property
    def outbox_names(self) -> list[str]:
        return [outbox.__outbox__.job_name for outbox in self.kit.outboxes]

    def jobs(self) -> JobsView:
        """Every job with its schedule in words, last run, failure count and (drain jobs) pause."""
        scheduled: list[JobInfo] | None = None
        source_error = None
        if self.job_source is not None:
            try:
                scheduled = [_job_info(job) for job in self.job_source.jobs()]
            except Exception as exc:  # a scheduler's trouble must not take the page down
                source_error = f"{type(exc).__name__}: {exc}"
        with self.kit.operator_database.connect() as connection:
            runs = last_runs(connection, [job.id for job in scheduled] if scheduled is not None else None)
            key = self.kit.settings.advisory_lock_key
            holders = [LeaderModel.model_validate(holder) for holder in leaders(connection, key=key)]
            pauses = paused_outboxes(connection)
            if scheduled is None:
                # Every outbox's drain job is known without a job source; other jobs only once they ran.
                seen = [JobInfo(id=run.job_id, name=run.job_name, trigger="") for run in runs.values()]
                drains = [JobInfo(id=drain_job_id(name), name=name, trigger="") for name in self.outbox_names]
                infos = list({job.id: job for job in drains + seen}.values())
            else:
                infos = scheduled
            failures = job_failure_counts(connection, [job.id for job in infos])
        jobs = [
            self._job_entry(job, runs.get(job.id), failures.get(job.id, (0, 0)), pauses, listed=scheduled is not None)
            for job in infos
        ]
        return JobsView(
            source="job_source" if scheduled is not None else "run_history",
            source_error=source_error,
            leader=holders[0] if holders else None,
            leaders=holders,
            jobs=sorted(jobs, key=lambda job: (job.outbox is None, job.id)),
        )

    def _job_entry(
        self, job: JobInfo, run: Any, failures: tuple[int, int], pauses: dict[str, Pause], *, listed: bool
    ) -> JobEntry:
        outbox = job.id[len(DRAIN_JOB_PREFIX) :] if job.id.startswith(DRAIN_JOB_PREFIX) else None
        if outbox not in self.outbox_names:
            outbox = None
        trigger: Any = self._trigger_object(job.id) if listed else None
        if trigger is None and listed:
            trigger = job.trigger
        if trigger is None and outbox is not None:
            trigger = every(seconds=self.kit.settings.drain_interval_seconds)  # the kit's own safety-net schedule
        pause = pauses.get(outbox) if outbox is not None else None
        return JobEntry(
            id=job.id,
            name=job.name,
            trigger=job.trigger if listed else None,
            schedule=describe_trigger(trigger) if trigger is not None else None,
            next_run_at=job.next_run_at,
            last_run=run_model(run),
            failures=failures[0],
            runs_kept=failures[1],
            outbox=outbox,
            paused=pause is not None,
            paused_by=pause.paused_by if pause else None,
            paused_at=pause.paused_at if pause else None,
        )

    def _trigger_object(self, job_id: str) -> Any:
        """The trigger object, from a job source that can look a job up (``OutboxScheduler.job``); else None."""
        lookup = getattr(self.job_source, "job", None)
        if not callable(lookup):
            return None
        try:
            return getattr(lookup(job_id), "trigger", None)
        except Exception:  # a source without that job, or one that fails: the text is shown instead
            return None

    def job_runs(self, job_id: str, *, limit: int) -> JobRunsView:
        """One job's last ``limit`` runs, newest first."""
        with self.kit.operator_database.connect() as connection:
            runs = [RunModel.model_validate(JobRun(**run)) for run in job_run_history(connection, job_id, limit=limit)]
        name = runs[0].job_name if runs else None
        if not runs and not any(job_id == drain_job_id(outbox) for outbox in self.outbox_names):
            raise UnknownJobError(f"no run of job {job_id!r} is recorded")
        return JobRunsView(job_id=job_id, name=name, runs=runs)


def run_model(run: Any) -> RunModel | None:
    """A job run as the operator sees it; None for a job that has not run."""
    return RunModel.model_validate(run) if run is not None else None


def _job_info(job: Any) -> JobInfo:
    """Accept a JobInfo or any object with the same attributes; refuse anything else clearly."""
    try:
        info = JobInfo(
            id=str(job.id), name=str(job.name), trigger=str(job.trigger), next_run_at=getattr(job, "next_run_at", None)
        )
    except AttributeError as exc:
        raise InvalidTypeError(f"a JobSource returned {type(job).__name__}, which lacks {exc.name!r}") from None
    if info.next_run_at is not None and not isinstance(info.next_run_at, datetime):
        raise InvalidTypeError(f"job {info.id!r}: next_run_at must be a datetime or None")
    return info
