"""The trigger loop: every process fires the schedule rows that are due, and no occurrence is fired twice.

No leader is needed.  Each step of the loop protects one invariant:

1. **Claim** (``fire_due``).  A short transaction selects the due rows
   (``enabled AND next_run_at <= now``, of jobs this process registers or
   outboxes it knows) ``FOR UPDATE SKIP LOCKED``, decides for each which
   occurrence runs and which are missed (``outboxkit.misfires``), writes
   that, advances ``next_run_at`` and commits.  Two processes therefore take
   disjoint rows, and a row they take next time is already advanced past
   the occurrences fired: each occurrence is claimed once.  If the
   transaction rolls back, nothing of it happened: the row is still due.
2. **Fence.**  In the same transaction the occurrence is inserted into the
   run history with its key ``(schedule name, fire time)`` and ``ON
   CONFLICT DO NOTHING``; an occurrence already there (fired by another
   path, e.g. ``run_job`` or the leader's scheduler under the same name) is
   not fired again.
3. **HTTP target.**  The request is inserted into its outbox in that same
   transaction (history outcome ``enqueued``), so each occurrence is
   enqueued exactly once; the outbox delivers it at least once (retries,
   backoff, ``stuck``, the row's idempotency key).
4. **Python job target.**  The claim also takes a lease
   (``outboxkit.schedule_leases``) if fewer than ``max_running`` are live,
   else the occurrence is recorded ``missed`` ("still running").  After the
   commit the job runs in this process's thread pool; the loop renews its
   leases; the outcome and the lease's release are one transaction.
5. **Sweep.**  Expired leases (their process died) are deleted and their
   runs marked ``abandoned``; a schedule with ``rerun_if_abandoned`` gets
   that occurrence run once more (at least once), otherwise it stays
   abandoned (at most once).
6. **Sleep** until the nearest ``next_run_at`` or lease expiry (at most
   ``max_idle_seconds``), or until a NOTIFY on ``outboxkit_schedules``
   (every change through ``ScheduleStore``) wakes the loop.

Time comes from the injected clock wherever "due" or "expired" is decided,
so tests drive every step with a ``ManualClock``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, bindparam, insert, text

from outboxkit import schedule_leases
from outboxkit.clock import Clock, SystemClock
from outboxkit.connections import SessionConnector, session_connector
from outboxkit.errors import ConfigurationError, InvalidScheduleError
from outboxkit.jobs import JobFunction, JobRunner, RunRecord, check_job_function
from outboxkit.misfires import FiringPlan, plan_firing
from outboxkit.model import Outbox
from outboxkit.notify import NotifyListener, notify_statement
from outboxkit.schedule_leases import LeaseGrant
from outboxkit.schedule_store import CHANNEL, definition_from_row
from outboxkit.scheduled_requests import ScheduledRequestOutbox
from outboxkit.schedules import HttpTarget, ScheduleDefinition
from outboxkit.telemetry import Telemetry

__all__ = ["Firing", "ScheduleRunner"]

logger = logging.getLogger("outboxkit.schedule_runner")

_CLAIMABLE = """
    enabled AND next_run_at IS NOT NULL
    AND ((target_kind = 'job' AND job IN :jobs) OR (target_kind = 'http' AND http_outbox IN :outboxes))
"""
_CLAIM = text(
    f"""
    SELECT * FROM outboxkit_schedules
    WHERE {_CLAIMABLE} AND next_run_at <= :now AND id NOT IN :skip
    ORDER BY next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
).bindparams(bindparam("jobs", expanding=True), bindparam("outboxes", expanding=True), bindparam("skip", expanding=True))
_NEAREST = text(
    f"""
    SELECT least(
        (SELECT min(next_run_at) FROM outboxkit_schedules WHERE {_CLAIMABLE}),
        (SELECT min(expires_at) FROM outboxkit_schedule_leases))
    """
).bindparams(bindparam("jobs", expanding=True), bindparam("outboxes", expanding=True))
_ADVANCE = text("UPDATE outboxkit_schedules SET next_run_at = :next_run_at WHERE id = :id")
_RECORD = text(
    """
    INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader)
    VALUES (:name, :name, :scheduled_for, clock_timestamp(),
            CASE WHEN :outcome = 'running' THEN NULL ELSE clock_timestamp() END,
            :outcome, CAST(:counts AS jsonb), :error, :holder)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id
    """
)
_SET_COUNTS = text("UPDATE outboxkit_job_runs SET counts = CAST(:counts AS jsonb) WHERE id = :run_id")
# A run that a re-run took over (the record names another holder, or another lease holds it) keeps
# the re-run's record; an abandoned run that nobody re-ran records its real outcome when it returns.
_FINISH = text(
    """
    UPDATE outboxkit_job_runs
    SET finished_at = clock_timestamp(), outcome = :outcome, counts = CAST(:counts AS jsonb), error = :error
    WHERE id = :run_id AND leader = :holder AND NOT EXISTS (
        SELECT 1 FROM outboxkit_schedule_leases WHERE run_id = :run_id AND token <> :token)
    """
)
_ABANDON = text(
    """
    UPDATE outboxkit_job_runs SET outcome = 'abandoned', error = :error
    WHERE id = :run_id AND outcome = 'running'
    RETURNING job_id
    """
)
_RESTART = text(
    "UPDATE outboxkit_job_runs SET outcome = 'running', leader = :holder, error = :note WHERE id = :run_id"
)
_SCHEDULE = text("SELECT id, name, job, max_running, rerun_if_abandoned FROM outboxkit_schedules WHERE id = :id")


@dataclass
class Firing:
    """What one step did: runs started, requests enqueued, occurrences missed, runs abandoned, rows that failed."""

    runs: list[Future[RunRecord]] = field(default_factory=list)
    enqueued: list[tuple[str, datetime]] = field(default_factory=list)
    missed: list[tuple[str, datetime]] = field(default_factory=list)
    abandoned: list[tuple[str, datetime]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def default_holder() -> str:
    """``<host>:<pid>:<random>``: names this runner in leases and in the run history."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ScheduleRunner:
    """Fires this process's share of the due schedule rows; see the module docstring for the steps.

    ``jobs`` maps a job name to its function (``def job(context: JobContext)``);
    ``outboxes`` are the kit's outbox classes (the ``ScheduledRequestOutbox``
    ones carry HTTP targets).  A process only claims the schedules it can
    fire, so during a rolling deploy a job that only the new code has is
    left to the new processes.  Drive it step by step (``fire_due``,
    ``sweep_expired_leases``, ``renew_leases``) or start its loop thread.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        jobs: Mapping[str, JobFunction] | None = None,
        outboxes: Iterable[type[Outbox]] = (),
        clock: Clock | None = None,
        holder: str | None = None,
        lease_seconds: float = 60.0,
        batch_size: int = 100,
        max_workers: int = 10,
        history_limit: int = 200,
        max_idle_seconds: float = 60.0,
        retry_seconds: float = 5.0,
        listen_connect: SessionConnector | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.engine = engine
        self.jobs = dict(jobs or {})
        for name, function in self.jobs.items():
            check_job_function(name, function)
        self.outboxes = {
            outbox.__outbox__.job_name: outbox for outbox in outboxes if issubclass(outbox, ScheduledRequestOutbox)
        }
        if lease_seconds <= 0 or max_idle_seconds <= 0 or retry_seconds <= 0 or batch_size < 1:
            raise ConfigurationError("lease_seconds, max_idle_seconds and retry_seconds must be > 0, batch_size >= 1")
        self.clock = clock or SystemClock()
        self.holder = holder or default_holder()
        self.lease_seconds = lease_seconds
        self.batch_size = batch_size
        self.max_idle_seconds = max_idle_seconds
        self.retry_seconds = retry_seconds
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.job_runner = JobRunner(engine, leader=lambda: self.holder, history_limit=history_limit)
        self._listen_connect = listen_connect or session_connector(
            engine=engine, dsn=None, application_name=f"outboxkit-schedules:{self.holder}"[:63], keepalive_seconds=15
        )
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="outboxkit-schedule")
        self._held: dict[uuid.UUID, LeaseGrant] = {}
        self._held_lock = threading.Lock()
        self._renewed_at: datetime | None = None
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: NotifyListener | None = None

    # -- the steps -------------------------------------------------------------

    def fire_due(self) -> Firing:
        """Claim every due schedule this process can fire, in batches; start the runs after each commit.

        A database error ends the step and propagates (that batch rolled
        back: its rows are still due); one schedule whose firing fails is
        rolled back to its savepoint alone, logged and listed in ``failed``.
        """
        firing = Firing()
        skip: list[int] = []
        while True:
            grants, claimed = self._claim_batch(firing, skip)
            for grant in grants:
                self._start(grant, firing)
            if claimed < self.batch_size:
                return firing

    def sweep_expired_leases(self) -> Firing:
        """Free the slots of runs whose lease expired: mark them abandoned, re-run those that allow it once."""
        now = self.clock.now()
        firing = Firing()
        grants: list[LeaseGrant] = []
        with self.engine.begin() as connection:
            for lease in schedule_leases.take_expired(connection, now=now):
                grant = self._abandon(connection, lease, now=now, firing=firing)
                if grant is not None:
                    grants.append(grant)
        for grant in grants:
            self._start(grant, firing)
        return firing

    def renew_leases(self) -> int:
        """Move the expiry of every lease this process holds; returns how many it still holds."""
        with self._held_lock:
            tokens = set(self._held)
        now = self.clock.now()
        self._renewed_at = now
        if not tokens:
            return 0
        with self.engine.begin() as connection:
            kept = schedule_leases.renew(connection, tokens, expires_at=now + timedelta(seconds=self.lease_seconds))
        for token in tokens - kept:
            grant = self._held.get(token)
            if grant is not None:
                logger.warning(
                    "%s: the run for %s lost its lease (it expired and was swept); it goes on, but its slot is free",
                    grant.schedule_name,
                    grant.scheduled_for.isoformat(),
                )
        return len(kept)

    def seconds_until_due(self) -> float:
        """How long the loop may sleep: until the nearest due row or lease expiry, at most ``max_idle_seconds``."""
        with self.engine.connect() as connection:
            nearest = connection.execute(_NEAREST, self._claimable()).scalar()
        wait = self.max_idle_seconds
        if nearest is not None:
            wait = min(wait, (nearest - self.clock.now()).total_seconds())
        with self._held_lock:
            holding = bool(self._held)
        if holding:
            wait = min(wait, self.lease_seconds / 3)
        return max(0.0, wait)

    def running(self) -> int:
        """How many runs this process holds a lease for."""
        with self._held_lock:
            return len(self._held)

    # -- the loop --------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread and its LISTEN connection.  Idempotent."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._listener = NotifyListener(connect=self._listen_connect, channels={CHANNEL: self.wake})
        self._listener.start()
        self._thread = threading.Thread(target=self._loop, name="outboxkit-schedules", daemon=True)
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop the loop; ``wait`` also waits for the runs in progress to record their outcome."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop(wait=wait)
        self._executor.shutdown(wait=wait)

    def wake(self) -> None:
        """Look at the schedule rows now (a NOTIFY, a test that moved its clock)."""
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Whether the loop is asleep, listening, with nothing due that it knows of."""
        listener = self._listener
        return self._idle.is_set() and listener is not None and listener.generation > 0 and not self._wake.is_set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sweep_expired_leases()
                if self._renewal_due():
                    self.renew_leases()
                firing = self.fire_due()
                wait = self.seconds_until_due()
                if firing.failed:
                    wait = max(wait, self.retry_seconds)
            except Exception as exc:  # the database is away: try again, never die
                logger.warning("schedule loop: %s; trying again in %g s", exc, self.retry_seconds)
                wait = self.retry_seconds
            self._idle.set()
            self._wake.wait(wait)
            self._idle.clear()
            self._wake.clear()

    def _renewal_due(self) -> bool:
        return self._renewed_at is None or self.clock.now() - self._renewed_at >= timedelta(seconds=self.lease_seconds / 3)

    # -- claiming ----------------------------------------------------------------

    def _claimable(self) -> dict[str, Any]:
        # An empty IN list is a syntax error in some drivers; a name no row has keeps the query plain.
        return {"jobs": list(self.jobs) or [""], "outboxes": list(self.outboxes) or [""]}

    def _claim_batch(self, firing: Firing, skip: list[int]) -> tuple[list[LeaseGrant], int]:
        now = self.clock.now()
        grants: list[LeaseGrant] = []
        with self.engine.begin() as connection:
            rows = connection.execute(
                _CLAIM, {**self._claimable(), "now": now, "skip": skip or [0], "limit": self.batch_size}
            ).mappings().all()
            for row in rows:
                savepoint = connection.begin_nested()
                try:
                    grant = self._fire_row(connection, row, now=now, firing=firing)
                    savepoint.commit()
                except Exception:
                    savepoint.rollback()
                    logger.exception("schedule %s: firing failed; it stays due and is tried again", row["name"])
                    firing.failed.append(row["name"])
                    skip.append(row["id"])
                    continue
                if grant is not None:
                    grants.append(grant)
        return grants, len(rows)

    def _fire_row(self, connection: Connection, row: RowMapping, *, now: datetime, firing: Firing) -> LeaseGrant | None:
        try:
            definition = definition_from_row(row)
        except InvalidScheduleError as exc:  # edited by hand in SQL: park it rather than claim it forever
            logger.error("schedule %s holds an invalid definition (%s); it will not fire until it is edited", row["name"], exc)
            connection.execute(_ADVANCE, {"id": row["id"], "next_run_at": None})
            return None
        plan = plan_firing(definition.trigger, due=row["next_run_at"], now=now, grace=definition.grace)
        if plan.missed_first is not None:
            self._record_missed(connection, definition, plan, firing)
        grant = None
        if plan.run_for is not None:
            if isinstance(definition.target, HttpTarget):
                self._enqueue(connection, definition, definition.target, plan.run_for, now=now, firing=firing)
            else:
                grant = self._lease(connection, row, definition, plan.run_for, now=now, firing=firing)
        connection.execute(_ADVANCE, {"id": row["id"], "next_run_at": plan.next_run_at})
        return grant

    def _record(
        self, connection: Connection, name: str, scheduled_for: datetime, outcome: str, *,
        counts: Mapping[str, int] | None = None, error: str | None = None,
    ) -> int | None:
        """Insert the occurrence into the run history under the fence; None if it is there already."""
        values = {
            "name": name,
            "scheduled_for": scheduled_for,
            "outcome": outcome,
            "counts": json.dumps(dict(counts or {})),
            "error": error,
            "holder": self.holder,
        }
        run_id = connection.execute(_RECORD, values).scalar()
        if run_id is None:
            logger.warning(
                "%s: the occurrence %s is in the run history already; not fired again", name, scheduled_for.isoformat()
            )
        return run_id

    def _record_missed(self, connection: Connection, definition: ScheduleDefinition, plan: FiringPlan, firing: Firing) -> None:
        assert plan.missed_first is not None
        message = plan.describe_missed(definition.grace)
        counts = {"missed": plan.missed_count}
        self._record(connection, definition.name, plan.missed_first, "missed", counts=counts, error=message)
        logger.warning("%s: %s", definition.name, message)
        firing.missed.append((definition.name, plan.missed_first))

    def _enqueue(
        self, connection: Connection, definition: ScheduleDefinition, target: HttpTarget, scheduled_for: datetime,
        *, now: datetime, firing: Firing,
    ) -> None:
        run_id = self._record(connection, definition.name, scheduled_for, "enqueued")
        if run_id is None:
            return
        outbox = self.outboxes[target.outbox]
        row_id = connection.execute(
            insert(outbox)
            .values(
                schedule_name=definition.name,
                scheduled_for=scheduled_for,
                method=target.method,
                url=target.url,
                headers=dict(target.headers),
                body=target.body,
                next_attempt_at=now,
            )
            .returning(outbox.id)
        ).scalar_one()
        connection.execute(_SET_COUNTS, {"run_id": run_id, "counts": json.dumps({"outbox_row": row_id})})
        connection.execute(notify_statement(outbox))
        firing.enqueued.append((definition.name, scheduled_for))

    def _lease(
        self, connection: Connection, row: RowMapping, definition: ScheduleDefinition, scheduled_for: datetime,
        *, now: datetime, firing: Firing,
    ) -> LeaseGrant | None:
        live = schedule_leases.count_live(connection, row["id"], now=now)
        if live >= definition.max_running:
            error = (
                f"not run: {live} run(s) of this schedule still held their lease (max_running={definition.max_running})"
            )
            if self._record(connection, definition.name, scheduled_for, "missed", error=error) is not None:
                logger.warning("%s: the occurrence %s was %s", definition.name, scheduled_for.isoformat(), error)
                firing.missed.append((definition.name, scheduled_for))
            return None
        run_id = self._record(connection, definition.name, scheduled_for, "running")
        if run_id is None:
            return None
        return schedule_leases.take(
            connection, schedule_id=row["id"], schedule_name=definition.name, job=row["job"], run_id=run_id,
            scheduled_for=scheduled_for, holder=self.holder, now=now, seconds=self.lease_seconds,
        )

    def _abandon(
        self, connection: Connection, lease: RowMapping, *, now: datetime, firing: Firing
    ) -> LeaseGrant | None:
        schedule = connection.execute(_SCHEDULE, {"id": lease["schedule_id"]}).mappings().one()
        reason = (
            f"the run never finished: its lease, held by {lease['holder']}, expired at {lease['expires_at'].isoformat()} "
            f"(the process died or stalled); marked abandoned by {self.holder}"
        )
        rerun = schedule["rerun_if_abandoned"] and lease["attempt"] == 1
        if rerun and schedule["job"] not in self.jobs:
            reason += f"; not re-run: no job {schedule['job']!r} is registered in this process"
            rerun = False
        if rerun and schedule_leases.count_live(connection, schedule["id"], now=now) >= schedule["max_running"]:
            reason += f"; not re-run: max_running={schedule['max_running']} run(s) hold their lease"
            rerun = False
        connection.execute(_ABANDON, {"run_id": lease["run_id"], "error": reason})
        logger.warning("%s: the run for %s: %s", schedule["name"], lease["scheduled_for"].isoformat(), reason)
        firing.abandoned.append((schedule["name"], lease["scheduled_for"]))
        if not rerun:
            return None
        note = f"re-run once by {self.holder}: the first run's lease, held by {lease['holder']}, expired"
        connection.execute(_RESTART, {"run_id": lease["run_id"], "holder": self.holder, "note": note})
        return schedule_leases.take(
            connection, schedule_id=schedule["id"], schedule_name=schedule["name"], job=schedule["job"],
            run_id=lease["run_id"], scheduled_for=lease["scheduled_for"], holder=self.holder, now=now,
            seconds=self.lease_seconds, attempt=2, note=note,
        )

    # -- running -------------------------------------------------------------------

    def _start(self, grant: LeaseGrant, firing: Firing) -> None:
        with self._held_lock:
            self._held[grant.token] = grant
        try:
            firing.runs.append(self._executor.submit(self._run, grant))
        except RuntimeError:  # stopped meanwhile: the lease expires and the sweep decides
            with self._held_lock:
                self._held.pop(grant.token, None)
            logger.warning("%s: not started, the runner is stopping; its lease will expire", grant.schedule_name)

    def _run(self, grant: LeaseGrant) -> RunRecord:
        started = time.monotonic()
        record = self.job_runner.call(
            grant.schedule_name, grant.schedule_name, self.jobs[grant.job], scheduled_for=grant.scheduled_for,
            leader=self.holder,
        )
        try:
            with self.engine.begin() as connection:
                if not schedule_leases.release(connection, grant.token):
                    logger.warning(
                        "%s: the run for %s outlived its lease; its outcome %s is recorded unless a re-run holds it",
                        grant.schedule_name, grant.scheduled_for.isoformat(), record.outcome,
                    )
                values = {
                    "run_id": grant.run_id,
                    "token": grant.token,
                    "holder": self.holder,
                    "outcome": record.outcome,
                    "counts": json.dumps(record.counts),
                    "error": record.error or grant.note,
                }
                connection.execute(_FINISH, values)
                self.job_runner.trim_history(connection, grant.schedule_name)
        except Exception as exc:  # the lease expires and the sweep marks the run abandoned
            logger.error("%s: could not record the run for %s: %s", grant.schedule_name, grant.scheduled_for.isoformat(), exc)
        finally:
            with self._held_lock:
                self._held.pop(grant.token, None)
        self.telemetry.job_finished(
            grant.schedule_name, grant.schedule_name, record, time.monotonic() - started
        )
        return record
