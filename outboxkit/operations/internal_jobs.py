"""The elected leader's jobs as the schedules list shows them: read-only, marked internal, with their run history.

Applications schedule their work as schedules (``kit.schedules``); the
leader still runs the kit's own jobs (the safety-net drain of each outbox,
retention, partitions) and, until they move, the jobs an application
registered with the deprecated ``kit.scheduler.add_job``.  Operators see
them on the one Schedules page and in the schedules API, each marked
``internal`` (the kit's own) or not (a deprecated registration), never
editable there.

They are listed by the admin's ``job_source`` when it has one, else by the
kit's own registry (``kit.scheduler``: its triggers give the next run
without asking the leader).  A listing that fails does not take the
schedules down: the kit's own jobs are then listed from the run history,
with the failure said (``outboxkit.operations.jobs_table``).
"""

from __future__ import annotations

from outboxkit.errors import UnknownJobError
from outboxkit.kit import OutboxKit
from outboxkit.operations.history import job_run_history
from outboxkit.operations.job_status import JobRun, JobSource
from outboxkit.operations.jobs_table import JobsTable
from outboxkit.operations.schedule_schemas import InternalJobModel, InternalJobsView
from outboxkit.operations.schemas import JobRunsView, RunModel
from outboxkit.schedules.jobs import KIT_JOB_PREFIX

__all__ = ["InternalJobs"]


class InternalJobs:
    """The elected jobs of one kit, read-only (``ScheduleAdmin.internal``)."""

    def __init__(self, kit: OutboxKit, job_source: JobSource | None = None) -> None:
        self.kit = kit
        self._job_source = job_source

    def _table(self) -> JobsTable:
        # The kit's registry is built on first use, so a schedules view that never lists them never loads APScheduler.
        return JobsTable(self.kit, self._job_source if self._job_source is not None else self.kit.scheduler)

    def view(self) -> InternalJobsView:
        """Every elected job with its schedule in words, next run, last run and failures; the leader."""
        listed = self._table().jobs()
        entries = [
            InternalJobModel(**job.model_dump(), internal=job.id.startswith(KIT_JOB_PREFIX))
            for job in listed.jobs
            # From the run history every recorded name shows up, schedules' too: only the kit's own are elected.
            if listed.source == "job_source" or job.id.startswith(KIT_JOB_PREFIX)
        ]
        return InternalJobsView(
            source=listed.source,
            source_error=listed.source_error,
            leader=listed.leader,
            jobs=sorted(entries, key=lambda job: (not job.internal, job.id)),
        )

    def entry(self, job_id: str) -> InternalJobModel:
        """One elected job (``UnknownJobError`` for an id no elected job has)."""
        view = self.view()
        for job in view.jobs:
            if job.id == job_id:
                return job
        known = ", ".join(job.id for job in view.jobs) or "none"
        raise UnknownJobError(f"no internal job {job_id!r}; the elected jobs here: {known}")

    def runs(self, job_id: str, *, limit: int) -> JobRunsView:
        """One elected job's last ``limit`` runs, newest first (``UnknownJobError`` for an id no elected job has)."""
        return self.history(self.entry(job_id), limit=limit)

    def history(self, job: InternalJobModel, *, limit: int) -> JobRunsView:
        """``job``'s last ``limit`` runs, newest first."""
        with self.kit.operator_database.connect() as connection:
            runs = [RunModel.model_validate(JobRun(**run)) for run in job_run_history(connection, job.id, limit=limit)]
        return JobRunsView(job_id=job.id, name=job.name, runs=runs)
