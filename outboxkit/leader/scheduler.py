"""The kit's schedule, run only by the elected leader.

``OutboxScheduler`` holds the job registry: one drain job per outbox (id
``outboxkit.drain.<job_name>``, name ``<job_name>``; monitors and logs key on
both, so renaming an outbox's ``job_name`` is a breaking change), the kit's
other internal jobs (retention, partitions), and, deprecated, the
application's own jobs (``add_job``: a ``ScheduleTrigger``, or ``cron``,
``every``, ``calendar_interval`` or ``once`` from ``outboxkit.schedules.jobs``).
Applications declare their jobs with ``kit.schedules.add_job`` instead
(``outboxkit.schedules``); ``add_job`` warns once per kit with a
``DeprecationWarning`` that says so.  The kit's own jobs are registered
without it, so they never warn.

Nothing is persisted in APScheduler: on every promotion a fresh in-memory
``BackgroundScheduler`` is built and every job is added from the registry
with ``replace_existing=True``.  All jobs coalesce missed runs into one and
never overlap themselves (``max_instances=1``); every run goes through
``JobRunner`` (fence, fresh session, history; see ``outboxkit.schedules.jobs``), and
learns its fire time through ``_OccurrenceScheduler``.  Before a scheduler
starts, runs left ``running`` by an earlier one are marked ``abandoned``.

``elect()`` starts a ``LeaderElection`` whose callbacks start and stop this
scheduler.  Drain work does not wait for leadership: every process that
enables it runs a ``DrainWorker`` (``outboxkit.drain.worker``) that claims on
NOTIFY and at due times.  The leader's drain job is the safety net behind
it: a bounded ``drain`` of each outbox every ``drain_interval_seconds``.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from apscheduler.events import EVENT_JOB_SUBMITTED, JobSubmissionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger

from outboxkit.drain.pooler_checks import check_engine, recheck_engine, session_source_accepted
from outboxkit.errors import ConfigurationError, UnknownJobError
from outboxkit.inbox.retention import inbox_retention_job
from outboxkit.leader.election import LeaderElection, leader_application_name
from outboxkit.leader.partitions import partitions_job
from outboxkit.leader.retention import retention_job
from outboxkit.model import Outbox
from outboxkit.results import RunRecord
from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.schedules.jobs import KIT_JOB_PREFIX, JobFailed, JobFunction, JobRunner, ScheduledJob, every
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore

__all__ = ["ADD_JOB_DEPRECATION", "JobInfo", "OutboxScheduler", "drain_job_id"]

logger = logging.getLogger(__name__)

DRAIN_JOB_PREFIX = "outboxkit.drain."
# Every job id under "outboxkit." belongs to the kit (drains, retention); applications use their own.

ADD_JOB_DEPRECATION = (
    "kit.scheduler.add_job is deprecated: declare the job with kit.schedules.add_job(id, function, "
    "ScheduleTrigger.cron(...) or ScheduleTrigger.every(...)) instead, a schedule that any process fires once per "
    "occurrence and that the admin's Schedules page lists; see docs/schedules.md, section "
    "'Moving from kit.scheduler.add_job'"
)


def drain_job_id(outbox: type[Outbox]) -> str:
    """The stable scheduler id of an outbox's drain job: ``outboxkit.drain.<job_name>``."""
    return f"{DRAIN_JOB_PREFIX}{outbox.__outbox__.job_name}"


@dataclass(frozen=True)
class JobInfo:
    """A registered job as the admin lists it (the admin's ``JobSource`` contract).

    ``next_run_at`` is an aware datetime, or None for a paused job.
    """

    id: str
    name: str
    trigger: str
    next_run_at: datetime | None = None


class _OccurrenceScheduler(BackgroundScheduler):
    """A ``BackgroundScheduler`` whose jobs learn the fire time they run for, through public API only.

    APScheduler 3.11 calls a job's function without the time it was
    scheduled for, and the fence keys on exactly that time: the occurrence's
    fire time from the trigger, the same in every process (``datetime.now()``
    in the job would differ per process and defeat the fence).  So each job
    is registered with a wrapper that takes its fire time from a per-job
    queue, and a listener on ``EVENT_JOB_SUBMITTED`` fills that queue with
    the event's ``scheduled_run_times``: exactly the fire times APScheduler
    submitted, in order.  The event is dispatched by the scheduler thread
    right after the submission (before its next wake-up), so the wrapper's
    wait is short.  Pairing by order is exact because a job never overlaps
    itself (``max_instances=1``): its next submission, and so its next fire
    time, comes only after the previous call has returned.  A submission
    that fails raises in APScheduler and posts no event and runs nothing.
    """

    # Never reached while the scheduler thread lives; a bound so a bug cannot hang a worker thread.
    HANDOFF_TIMEOUT_SECONDS = 60.0

    def __init__(self, *, max_workers: int) -> None:
        super().__init__(
            timezone=timezone.utc,
            executors={"default": ThreadPoolExecutor(max_workers=max_workers)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self._fire_times: dict[str, queue.SimpleQueue[datetime]] = {}
        self._fire_times_lock = threading.Lock()
        self.add_listener(self._submitted, EVENT_JOB_SUBMITTED)

    def add_occurrence_job(self, run: Callable[[datetime], object], *, id: str, name: str, trigger: BaseTrigger) -> None:
        """Add (or replace) a job whose function is ``run(scheduled_for)``."""
        self.add_job(
            self._run_occurrence,
            args=[id, run],
            trigger=trigger,
            id=id,
            name=name,
            max_instances=1,
            replace_existing=True,
        )

    def _queue(self, job_id: str) -> queue.SimpleQueue[datetime]:
        with self._fire_times_lock:
            return self._fire_times.setdefault(job_id, queue.SimpleQueue())

    def _submitted(self, event: JobSubmissionEvent) -> None:
        fire_times = self._queue(event.job_id)
        for scheduled_for in event.scheduled_run_times:
            fire_times.put(scheduled_for)

    def _run_occurrence(self, job_id: str, run: Callable[[datetime], object]) -> None:
        try:
            scheduled_for = self._queue(job_id).get(timeout=self.HANDOFF_TIMEOUT_SECONDS)
        except queue.Empty:
            logger.error("%s: no fire time was handed over by the scheduler; this run is skipped", job_id,
                         extra=log_fields("job.not_handed_over", job=job_id))
            return
        run(scheduled_for)


class OutboxScheduler:
    """The job registry and, while this process leads, the running APScheduler."""

    def __init__(
        self, kit: KitCore, *, max_workers: int = 10, reserved_ids: Callable[[str], str | None] | None = None
    ) -> None:
        """``reserved_ids(id)`` says why an application job may not take ``id`` (the kit: a schedule row's name)."""
        self.kit = kit
        self._reserved_ids = reserved_ids
        self.settings = kit.settings
        self.max_workers = max_workers
        self.runner = JobRunner(
            kit.engine, leader=self._leader_identity, history_limit=self.settings.job_history_limit, telemetry=kit.telemetry
        )
        self._lock = threading.RLock()
        self._jobs: dict[str, ScheduledJob] = {}
        self._scheduler: _OccurrenceScheduler | None = None
        self._election: LeaderElection | None = None
        self._warned = False  # add_job's DeprecationWarning, said once per kit
        for outbox in kit.drained_outboxes:  # a cdc outbox is read from the WAL, never drained
            self._jobs[drain_job_id(outbox)] = ScheduledJob(
                id=drain_job_id(outbox),
                name=outbox.__outbox__.job_name,
                trigger=every(seconds=self.settings.drain_interval_seconds),
                function=self._drain_function(outbox),
            )
            if kit.options(outbox).partition_by is not None:  # partitions ahead; retention drops whole partitions
                keeper = partitions_job(kit, outbox)
                self._jobs[keeper.id] = keeper
            elif kit.options(outbox).retain_done_for is not None:  # opt-in retention of delivered rows
                retention = retention_job(kit, outbox)
                self._jobs[retention.id] = retention
        if self.settings.inbox_retention_days is not None:  # opt-in pruning of the inbox (outboxkit.inbox.retention)
            pruning = inbox_retention_job(kit.engine, kit.clock, retention_days=self.settings.inbox_retention_days)
            self._jobs[pruning.id] = pruning

    # -- registry ------------------------------------------------------------

    def add_job(
        self, id: str, function: JobFunction, trigger: ScheduleTrigger | BaseTrigger, *, name: str | None = None
    ) -> ScheduledJob:
        """Deprecated: register (or replace) an application job run by the leader; takes effect at once if this
        process leads.

        Use ``kit.schedules.add_job(id, function, ScheduleTrigger...)`` instead
        (docs/schedules.md, "Moving from kit.scheduler.add_job").  Warns once
        per kit (``DeprecationWarning``).  ``trigger`` is a ``ScheduleTrigger``
        (the one trigger vocabulary) or, as before, a trigger of
        ``outboxkit.schedules.jobs``.
        """
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(ADD_JOB_DEPRECATION, DeprecationWarning, stacklevel=2)
        if isinstance(trigger, ScheduleTrigger):
            trigger = trigger.apscheduler_trigger()
        if id.startswith(KIT_JOB_PREFIX):
            raise ConfigurationError(
                f"job ids starting with {KIT_JOB_PREFIX!r} are reserved for the kit's own jobs (drains, retention); "
                "use your application's own prefix, e.g. 'billing.expire-trials'"
            )
        reserved = self._reserved_ids(id) if self._reserved_ids is not None else None
        if reserved is not None:
            raise ConfigurationError(reserved)
        job = ScheduledJob(id=id, name=name or id, trigger=trigger, function=function)
        with self._lock:
            self._jobs[id] = job
            if self._scheduler is not None:
                self._schedule(self._scheduler, job)
        return job

    def remove_job(self, id: str) -> None:
        """Unregister an application job (the kit's own jobs stay)."""
        if id.startswith(KIT_JOB_PREFIX):
            raise ConfigurationError("the kit's own jobs (drains, retention) cannot be removed")
        with self._lock:
            self.job(id)
            del self._jobs[id]
            if self._scheduler is not None:
                self._scheduler.remove_job(id)

    def job(self, id: str) -> ScheduledJob:
        with self._lock:
            try:
                return self._jobs[id]
            except KeyError:
                raise UnknownJobError(f"no job {id!r}; registered: {', '.join(sorted(self._jobs))}") from None

    def jobs(self) -> list[JobInfo]:
        """Every registered job with its next fire time (from the live scheduler while leading)."""
        now = datetime.now(timezone.utc)
        with self._lock:
            infos = []
            for job in self._jobs.values():
                live = self._scheduler.get_job(job.id) if self._scheduler is not None else None
                next_run = live.next_run_time if live is not None else job.trigger.get_next_fire_time(None, now)
                infos.append(JobInfo(id=job.id, name=job.name, trigger=str(job.trigger), next_run_at=next_run))
            return infos

    def run_job(self, id: str, *, scheduled_for: datetime) -> RunRecord:
        """Run one occurrence now, under the fence (as the scheduler would for that fire time)."""
        return self.runner.run(self.job(id), scheduled_for=scheduled_for)

    # -- running (called by the election) ------------------------------------

    @property
    def running(self) -> bool:
        with self._lock:
            return self._scheduler is not None

    def start(self) -> None:
        """Build a fresh in-memory scheduler, add every job and start it."""
        with self._lock:
            if self._scheduler is not None:
                return
            scheduler = _OccurrenceScheduler(max_workers=self.max_workers)
            for job in self._jobs.values():
                self._schedule(scheduler, job)
            # Before the first fire time: every run still 'running' now was started by an earlier scheduler.
            self.runner.abandon_unfinished(list(self._jobs))
            scheduler.start()
            self._scheduler = scheduler
        logger.info("scheduler started with %d job(s)", len(self._jobs),
                    extra=log_fields("scheduler.started", jobs=len(self._jobs)))

    def shutdown(self, wait: bool = True) -> None:
        """Stop the scheduler; ``wait=False`` returns without waiting for running jobs (a lost lock)."""
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        scheduler.shutdown(wait=wait)
        logger.info("scheduler stopped", extra=log_fields("scheduler.stopped"))

    def _schedule(self, scheduler: _OccurrenceScheduler, job: ScheduledJob) -> None:
        def run_occurrence(scheduled_for: datetime) -> RunRecord:
            return self.runner.run(job, scheduled_for=scheduled_for)

        scheduler.add_occurrence_job(run_occurrence, id=job.id, name=job.name, trigger=job.trigger)

    def _drain_function(self, outbox: type[Outbox]) -> JobFunction:
        # The safety net behind the drain loops (which claim on NOTIFY and at
        # due times in every draining process): it drains whatever a lost
        # notification or a process without drain loops left due.  Bounded
        # within the interval, so it ends before the next fire time instead
        # of making the scheduler skip that one (max_instances=1).
        max_seconds = self.settings.drain_interval_seconds * 0.9

        def drain(context: object) -> dict[str, int]:
            result = self.kit.drain(outbox, max_seconds=max_seconds)
            if result.error:
                # A missing table was already said once, with its fix, by the drain: keep the job's log quiet.
                raise JobFailed(f"drain failed: {result.error}", quiet=result.schema_problem)
            return result.as_counts()

        return drain

    # -- election ------------------------------------------------------------

    @property
    def lock_dsn(self) -> str:
        """A libpq URL of the lock database (``OutboxKit.lock_dsn``).

        The connection itself comes from ``OutboxKit.session_connector``.
        """
        return self.kit.lock_dsn

    @property
    def election(self) -> LeaderElection | None:
        return self._election

    def elect(self, **overrides: object) -> LeaderElection:
        """Start campaigning; the scheduler runs while this process leads.  Idempotent."""
        with self._lock:
            if self._election is None:
                if not self.settings.is_production:
                    # Said at every start, not only when an election fails: by then it is too late to notice.
                    logger.warning(
                        "OUTBOXKIT_ENVIRONMENT=%s: if the leader election fails, this process runs the scheduler "
                        "without the lock (fail open, meant for a laptop); production must set "
                        "OUTBOXKIT_ENVIRONMENT=production, which runs no scheduler then",
                        self.settings.environment,
                        extra=log_fields("scheduler.fails_open", environment=self.settings.environment),
                    )
                check_engine(self.kit)  # an engine that prepares through a transaction pool (production raises)
                connection: dict[str, object] = {}
                if "dsn" not in overrides and "connect" not in overrides:
                    # A transaction-mode pooler is refused here, before any thread (production raises).
                    session_source_accepted(self.kit, leader_application_name(), purpose="the leader lock connection")
                    connection = {
                        "connect": self.kit.session_connector(leader_application_name()),
                        "source": self.kit.session_source,
                    }
                options = {
                    **connection,
                    "key": self.settings.advisory_lock_key,
                    "leader_tick_seconds": self.settings.leader_tick_seconds,
                    "standby_probe_seconds": self.settings.standby_probe_seconds,
                    "fail_open": not self.settings.is_production,
                    "telemetry": self.kit.telemetry,
                    "recheck": lambda: recheck_engine(self.kit),  # a fooled start-up check is caught while leading
                    **overrides,
                }
                self._election = LeaderElection(on_elected=self.start, on_demoted=self.shutdown, **options)  # type: ignore[arg-type]
                self._election.start()
            return self._election

    def resign(self) -> None:
        """Stop campaigning: stop the scheduler, release the lock, close the connection."""
        with self._lock:
            election, self._election = self._election, None
        if election is not None:
            election.stop()
        self.shutdown(wait=True)

    def _leader_identity(self) -> str:
        election = self._election
        if election is not None:
            return election.identity if election.backend_pid is not None else f"{election.identity} (unelected)"
        return f"{socket.gethostname()}:{os.getpid()} (unelected)"
