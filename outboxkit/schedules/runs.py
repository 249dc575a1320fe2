"""The runs of scheduled Python jobs that one process holds a lease for: start, renew, record.

``ScheduleRunner`` (``outboxkit.schedules.runner``) claims an occurrence and
hands its ``LeaseGrant`` here.  ``HeldRuns`` runs the job in its thread pool,
renews the leases of the runs in progress (the runner's loop calls
``renew``), and writes each run's outcome, the release of its lease and the
trim of the schedule's history in **one statement**: either all of it is
recorded or none of it, and it costs one round trip.  A dropped connection
(a database restart) does not turn a finished run into an abandoned one:
the outcome is written again on a fresh connection for as long as the lease
would last.

A run that ends frees a slot and re-arms the runner's loop (``on_run_end``)
for its schedule's next fire time: the loop's sleep, computed while this run
held the slot, left that schedule out.  It wakes the loop at once when that
can matter now: its schedule's next occurrence is due already and waits for
this slot, the pool was full, or the run was a re-run of an abandoned one
(its schedule's next fire time is not known here).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from outboxkit.results import RunRecord
from outboxkit.schedules import leases
from outboxkit.schedules.claims import Firing
from outboxkit.schedules.fences import bound_idle, lock_fence_sql, trim_history_sql
from outboxkit.schedules.jobs import JobFunction, JobRunner
from outboxkit.schedules.leases import LeaseGrant
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.telemetry.hooks import Telemetry
from outboxkit.telemetry.log_events import log_fields

__all__ = ["HeldRuns"]

logger = logging.getLogger(__name__)

# Release the lease, record the outcome, trim the schedule's history: one statement.  A run that a re-run
# took over (the record names another holder, or another lease holds it) keeps the re-run's record; an
# abandoned run that nobody re-ran records its real outcome when it returns.  ``released`` is 0 when the
# lease was gone already (it expired and was swept).  The trim keeps the newest :keep finished runs and
# every run in progress (its outcome, or the sweep's 'abandoned', updates it later), and moves the schedule's
# fence past the runs it deletes (outboxkit.schedules.fences).  Every CTE sees the snapshot from before the
# statement, where the run recorded here is still 'running': it is counted among the finished ones and never
# trimmed.  The job's counts keep the claim's ``coalesced`` (the earlier fire times this run covers).
_RECORD_OUTCOME = text(
    f"""
    WITH released AS (
        DELETE FROM outboxkit_schedule_leases WHERE token = :token RETURNING token
    ), {lock_fence_sql(":name")}, finished AS (
        UPDATE outboxkit_job_runs
        SET finished_at = clock_timestamp(), outcome = :outcome, error = :error,
            counts = CAST(:counts AS jsonb) || jsonb_strip_nulls(jsonb_build_object('coalesced', counts -> 'coalesced'))
        WHERE (SELECT count(*) FROM fence_lock) >= 0 AND id = :run_id AND leader = :holder AND NOT EXISTS (
            SELECT 1 FROM outboxkit_schedule_leases WHERE run_id = :run_id AND token <> :token)
        RETURNING id
    ), {trim_history_sql(":name", kept="outcome <> 'running' OR id = :run_id", also=" AND id <> :run_id")}
    SELECT (SELECT count(*) FROM released), (SELECT count(*) FROM trimmed)
    """
)


class HeldRuns:
    """This process's runs in progress, each under its lease; ``max_workers`` of them at most."""

    def __init__(
        self,
        engine: Engine,
        *,
        jobs: Mapping[str, JobFunction],
        holder: str,
        lease_seconds: float,
        max_workers: int,
        job_runner: JobRunner,
        clock: DatabaseTime,
        telemetry: Telemetry,
        on_run_end: Callable[[datetime | None], None],
    ) -> None:
        self.engine = engine
        self.jobs = jobs
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.max_workers = max_workers
        self.job_runner = job_runner
        self.clock = clock
        self.telemetry = telemetry
        self.on_run_end = on_run_end
        self._executor = self._new_executor()
        self._stopped = False
        self._held: dict[uuid.UUID, LeaseGrant] = {}
        self._lock = threading.Lock()
        self._retrying = Retrying(
            retry=retry_if_exception_type(DBAPIError),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            stop=stop_after_delay(lease_seconds),
            reraise=True,
        )

    def count(self) -> int:
        with self._lock:
            return len(self._held)

    def start(self, grant: LeaseGrant, firing: Firing) -> None:
        """Run the granted occurrence in the pool; its future joins ``firing.runs``."""
        with self._lock:
            self._held[grant.token] = grant
        try:
            firing.runs.append(self._executor.submit(self.run, grant))
        except RuntimeError:  # stopped meanwhile: the lease expires and the sweep decides
            with self._lock:
                self._held.pop(grant.token, None)
            logger.warning(
                "%s: not started, the runner is stopping; its lease will expire", grant.schedule_name,
                extra=log_fields("schedule.not_started"),
            )

    def hold(self, grant: LeaseGrant) -> None:
        """Count a run this thread will make itself (``run_job``)."""
        with self._lock:
            self._held[grant.token] = grant

    def run(self, grant: LeaseGrant) -> RunRecord:
        """Call the job, then record its outcome with the lease's release; never raises."""
        started = time.monotonic()
        record = self.job_runner.call(
            grant.schedule_name, grant.schedule_name, self.jobs[grant.job], scheduled_for=grant.scheduled_for,
            leader=self.holder,
        )
        with self._lock:  # no longer renewed: the lease is released with the outcome
            was_full = len(self._held) >= self.max_workers
            self._held.pop(grant.token, None)
        try:
            self._retrying(self._record_outcome, grant, record)
        except Exception as exc:  # the lease expires and the sweep marks the run abandoned
            logger.error(
                "%s: could not record the run for %s: %s", grant.schedule_name, grant.scheduled_for.isoformat(), exc,
                extra=log_fields("schedule.record_failed"),
            )
        waiting = grant.next_run_at is None or grant.next_run_at <= self.clock.now()
        self.on_run_end(None if was_full or waiting else grant.next_run_at)
        self.telemetry.job_finished(grant.schedule_name, grant.schedule_name, record, time.monotonic() - started)
        return record

    def _record_outcome(self, grant: LeaseGrant, record: RunRecord) -> None:
        values = {
            "run_id": grant.run_id,
            "token": grant.token,
            "holder": self.holder,
            "name": grant.schedule_name,
            "keep": self.job_runner.history_limit,
            "outcome": record.outcome,
            "counts": json.dumps(record.counts),
            "error": record.error or grant.note,
        }
        with self.engine.begin() as connection:
            bound_idle(connection)
            released, _ = connection.execute(_RECORD_OUTCOME, values).one()
        if not released:
            logger.warning(
                "%s: the run for %s outlived its lease; its outcome %s is recorded unless a re-run holds it",
                grant.schedule_name, grant.scheduled_for.isoformat(), record.outcome,
                extra=log_fields("schedule.lease_outlived"),
            )

    def renew(self) -> int:
        """Move the expiry of every lease held here; returns how many are still held."""
        with self._lock:
            tokens = set(self._held)
        if not tokens:
            return 0
        with self.engine.begin() as connection:
            now = self.clock.read(connection)
            kept = leases.renew(connection, tokens, expires_at=now + timedelta(seconds=self.lease_seconds))
        for token in tokens - kept:
            with self._lock:  # a run that ended meanwhile released its own lease
                grant = self._held.get(token)
            if grant is not None:
                logger.warning(
                    "%s: the run for %s lost its lease (it expired and was swept); it goes on, but its slot is free",
                    grant.schedule_name, grant.scheduled_for.isoformat(),
                    extra=log_fields("schedule.lease_lost"),
                )
        return len(kept)

    def resume(self) -> None:
        """After ``shutdown``: a fresh pool."""
        if self._stopped:
            self._executor = self._new_executor()
            self._stopped = False

    def shutdown(self, *, wait: bool) -> None:
        self._stopped = True
        self._executor.shutdown(wait=wait)

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="outboxkit-schedule")
