"""The trigger loop: every process fires the schedule rows that are due, and no occurrence is fired twice.

(The claim's writes are in ``outboxkit.schedules.claims``; the runs this process holds a lease for, their
threads, renewals and outcomes in ``outboxkit.schedules.runs``.)

No leader is needed.  Each step of the loop protects one invariant:

1. **Claim** (``fire_due``).  A short transaction selects the due rows
   (``next_run_at <= now``, enabled or with a "run now" pending, of jobs this process registers or
   outboxes it knows) ``FOR UPDATE SKIP LOCKED``, decides for each which
   occurrence runs and which are missed (``outboxkit.schedules.misfires``), writes
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
   (``outboxkit.schedules.leases``); a row whose ``max_running`` leases are
   live is not claimed and waits, due, for a slot (its occurrences then
   coalesce within the grace).  After the commit the job runs in this
   process's thread pool; the loop renews its leases; the outcome and the
   lease's release are one transaction.
5. **Sweep.**  Expired leases (their process died) are deleted and their
   runs marked ``abandoned``; a schedule with ``rerun_if_abandoned`` gets
   that occurrence run once more (at least once), otherwise it stays
   abandoned (at most once).
6. **Sleep** until the nearest ``next_run_at`` or lease expiry (at most
   ``max_idle_seconds``), or until a NOTIFY on ``outboxkit_schedules``
   (every change through ``ScheduleStore``) wakes the loop.  The sleep
   leaves out the schedules whose runs hold their slots; a run that ends
   re-arms it for its schedule's next fire time (``outboxkit.schedules.alarm``),
   so a job alone in its process keeps its cadence.

Time comes from the database server's clock wherever "due" or "expired" is
decided, read in each deciding transaction (``outboxkit.storage.database_time``),
so hosts need no synchronised clocks; tests drive every step with a
``ManualClock`` (``run_pending``, ``run_job``), which stands in for it.  What the claim writes inside its transaction is in
``outboxkit.schedules.claims``; the lease rows in ``outboxkit.schedules.leases``.

One module, past 400 lines: the loop's wake, claim, run and sleep share the runner's state (its reading of the
server's time, the runs it holds), which a split would have to pass around.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import Engine, RowMapping

from outboxkit.clock import Clock, SystemClock
from outboxkit.errors import ConfigurationError, UnknownJobError, UnknownOutboxError, UnknownScheduleError
from outboxkit.model import Outbox
from outboxkit.results import RunRecord
from outboxkit.schedules import leases
from outboxkit.schedules.alarm import LoopAlarm
from outboxkit.schedules.claims import Firing, ScheduleClaims
from outboxkit.schedules.definitions import HttpTarget
from outboxkit.schedules.fences import bound_idle
from outboxkit.schedules.jobs import JobFunction, JobRunner, check_job_function
from outboxkit.schedules.leases import LeaseGrant
from outboxkit.schedules.requests import ScheduledRequestOutbox
from outboxkit.schedules.rows import definition_from_row
from outboxkit.schedules.runs import HeldRuns
from outboxkit.schedules.store import CHANNEL
from outboxkit.storage.connections import SessionConnector, session_connector
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.notify import NotifyListener
from outboxkit.telemetry.hooks import Telemetry
from outboxkit.telemetry.log_events import log_fields

__all__ = ["Firing", "ScheduleRunner"]

# The loop looks for expired leases at most this often: a lease's expiry is a matter of seconds, and
# under a backlog every run that ends wakes the loop.
SWEEP_SECONDS = 1.0

logger = logging.getLogger(__name__)

def default_holder() -> str:
    """``<host>:<pid>:<random>``: names this runner in leases and in the run history."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ScheduleRunner:
    """Fires this process's share of the due schedule rows; see the module docstring for the steps.

    ``jobs`` maps a job name to its function (``def job(context: JobContext)``);
    ``outboxes`` are the kit's outbox classes (the ``ScheduledRequestOutbox``
    ones carry HTTP targets).  A process only claims the schedules it can
    fire, so during a rolling deploy a job that only the new code has is
    left to the new processes.  It claims no more job rows than it has free
    workers (``max_workers``), so what it cannot start now stays due for
    another process instead of queueing here; an HTTP target takes no worker
    (it is an insert in the claim), so busy workers never hold one back.  ``lease_seconds`` (30) bounds how long
    a dead holder keeps its schedule waiting.  Due and expired times are decided by the
    database server's clock (``outboxkit.storage.database_time``); ``clock`` is used
    only when it is a ``ManualClock`` (a test's time).  Drive it step by step (``fire_due``,
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
        lease_seconds: float = 30.0,
        batch_size: int = 100,
        max_workers: int = 16,
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
        self.database_time = DatabaseTime(self.clock)  # due and expired by the server's clock (storage.database_time)
        self.holder = holder or default_holder()
        self.lease_seconds = lease_seconds
        self.batch_size = batch_size
        self.max_idle_seconds = max_idle_seconds
        self.retry_seconds = retry_seconds
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self.job_runner = JobRunner(engine, leader=lambda: self.holder, history_limit=history_limit)
        self.claims = ScheduleClaims(
            jobs=self.jobs, outboxes=self.outboxes, holder=self.holder, lease_seconds=lease_seconds
        )
        self._listen_connect = listen_connect or session_connector(
            engine=engine, dsn=None, application_name=f"outboxkit-schedules:{self.holder}"[:63], keepalive_seconds=15
        )
        self.max_workers = max_workers
        self.runs = HeldRuns(
            engine, jobs=self.jobs, holder=self.holder, lease_seconds=lease_seconds, max_workers=max_workers,
            job_runner=self.job_runner, clock=self.database_time, telemetry=self.telemetry, on_run_end=self.rearm,
        )
        # Cadences, on the monotonic clock: a step of the wall clock must not stop the renewals.
        self._renewed_at: float | None = None
        self._swept_at: float | None = None
        self._alarm = LoopAlarm()
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
            # An HTTP target is an insert: its rows are claimed a full batch at a time, however busy the workers.
            # A job's row is claimed only for a free worker: what this process cannot start now stays due for
            # another process instead of queueing here.  A batch cut short by that limit ends the step, so the
            # loop renews its leases between batches.
            limits = {
                "http": self.batch_size if self.outboxes else 0,
                "job": min(self.batch_size, self.max_workers - self.running()) if self.jobs else 0,
            }
            if all(limit <= 0 for limit in limits.values()):
                return firing
            grants, full = self._claim_batch(firing, skip, limits)
            for grant in grants:
                self.runs.start(grant, firing)
            if not full or self._stopping.is_set():
                return firing

    def _claim_batch(self, firing: Firing, skip: list[int], limits: Mapping[str, int]) -> tuple[list[LeaseGrant], bool]:
        # The batch's rows are fired in one transaction with no savepoint each (two round trips per row saved);
        # if one row's firing fails, the whole batch rolls back and is claimed again, each row under its savepoint.
        attempt = Firing()
        try:
            grants, full = self._claim_rows(attempt, skip, limits, isolated=False)
        except Exception:
            attempt = Firing()
            grants, full = self._claim_rows(attempt, skip, limits, isolated=True)
        firing.extend(attempt)
        return grants, full

    def _claim_rows(
        self, firing: Firing, skip: list[int], limits: Mapping[str, int], *, isolated: bool
    ) -> tuple[list[LeaseGrant], bool]:
        """Fire the due rows of each target kind, up to its limit; whether a kind filled a whole batch."""
        grants: list[LeaseGrant] = []
        with self.engine.begin() as connection:
            bound_idle(connection)  # it may take fences (outboxkit.schedules.fences)
            now = self.database_time.read(connection)
            rows: list[RowMapping] = []
            full = False
            for kind, limit in limits.items():
                if limit > 0:
                    claimed = self.claims.due(connection, now=now, skip=skip, limit=limit, kind=kind)
                    full = full or len(claimed) == self.batch_size
                    rows.extend(claimed)
            for row in rows:
                if not isolated:
                    grant = self.claims.fire(connection, row, now=now, firing=firing)
                    if grant is not None:
                        grants.append(grant)
                    continue
                savepoint = connection.begin_nested()
                try:
                    grant = self.claims.fire(connection, row, now=now, firing=firing)
                    savepoint.commit()
                except Exception:
                    savepoint.rollback()
                    logger.exception(
                        "schedule %s: firing failed; it stays due and is tried again", row["name"],
                        extra=log_fields("schedule.firing_failed"),
                    )
                    firing.failed.append(row["name"])
                    skip.append(row["id"])
                    continue
                if grant is not None:
                    grants.append(grant)
        return grants, full

    def sweep_expired_leases(self) -> Firing:
        """Free the slots of runs whose lease expired: mark them abandoned, re-run those that allow it once."""
        firing = Firing()
        grants: list[LeaseGrant] = []
        with self.engine.begin() as connection:
            bound_idle(connection)  # it may take fences (outboxkit.schedules.fences)
            now = self.database_time.read(connection)
            for lease in leases.take_expired(connection, now=now):
                grant = self.claims.abandon(connection, lease, now=now, firing=firing)
                if grant is not None:
                    grants.append(grant)
        for grant in grants:
            self.runs.start(grant, firing)
        return firing

    def renew_leases(self) -> int:
        """Move the expiry of every lease this process holds; returns how many it still holds."""
        self._renewed_at = time.monotonic()
        return self.runs.renew()

    def seconds_until_due(self) -> float:
        """How long the loop may sleep: until the nearest due row or lease expiry, at most ``max_idle_seconds``."""
        held = self.running()
        jobs_free = held < self.max_workers  # else a run that ends wakes the loop; HTTP targets still fire
        if not jobs_free and not self.outboxes:
            return self.lease_seconds / 3
        sent_at = time.monotonic()
        with self.engine.connect() as connection:
            due, expiry, database_now = self.claims.nearest(
                connection, now=self.database_time.now(), jobs_free=jobs_free
            )
        self.database_time.observe(database_now, sent_at=sent_at)
        now = self.database_time.now()
        wait = self.max_idle_seconds
        if due is not None:
            wait = min(wait, (due - now).total_seconds())
        if expiry is not None:  # swept at most every SWEEP_SECONDS
            wait = min(wait, max((expiry - now).total_seconds(), self._seconds_until_sweep()))
        if held:
            wait = min(wait, self.lease_seconds / 3)
        return max(0.0, wait)

    def running(self) -> int:
        """How many runs this process holds a lease for."""
        return self.runs.count()

    # -- driving it by hand (tests, "run now" from a shell) ---------------------

    def run_pending(self, *, timeout: float = 60.0) -> Firing:
        """One turn of the loop at the clock's current time, waiting for the runs it started.

        Sweeps expired leases, fires every due schedule and waits up to
        ``timeout`` seconds for each run to record its outcome.  With a
        ``ManualClock``: ``clock.advance(hours=1); runner.run_pending()``.
        """
        firing = self.sweep_expired_leases()
        firing.extend(self.fire_due())
        for run in firing.runs:
            run.result(timeout=timeout)
        return firing

    def run_job(self, name: str, *, scheduled_for: datetime | None = None) -> RunRecord:
        """Run one occurrence of the schedule ``name`` now, in this thread, and return its record.

        It goes through the same fence, lease and history as a fired
        occurrence (``scheduled_for`` defaults to the clock's now) but leaves
        ``next_run_at`` alone.  An HTTP target is enqueued (outcome
        ``enqueued``, ``counts["outbox_row"]`` its row).  The outcome is
        ``skipped`` if that occurrence is in the history already, ``missed``
        if ``max_running`` runs hold their lease.
        """
        firing = Firing()
        with self.engine.begin() as connection:
            bound_idle(connection)  # it may take fences (outboxkit.schedules.fences)
            now = self.database_time.read(connection)
            occurrence = scheduled_for or now
            row = self.claims.one(connection, name)
            if row is None:
                raise UnknownScheduleError(f"no schedule named {name!r}")
            definition = definition_from_row(row)
            target = definition.target
            if isinstance(target, HttpTarget):
                if target.outbox not in self.outboxes:
                    raise UnknownOutboxError(f"schedule {name!r}: no ScheduledRequestOutbox {target.outbox!r} here")
                row_id = self.claims.enqueue(connection, definition, target, occurrence, now=now, firing=firing)
                if row_id is None:
                    return RunRecord(outcome="skipped", counts={})
                return RunRecord(outcome="enqueued", counts={"outbox_row": row_id})
            if target.job not in self.jobs:
                raise UnknownJobError(f"schedule {name!r}: no job {target.job!r} is registered with this runner")
            grant = self.claims.lease(connection, row, definition, occurrence, now=now, firing=firing)
        if grant is None:
            return RunRecord(outcome="missed" if firing.missed else "skipped", counts={})
        self.runs.hold(grant)
        return self.runs.run(grant)

    # -- the loop --------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread and its LISTEN connection.  Idempotent; a stopped runner starts again."""
        if self._thread is not None:
            return
        self.runs.resume()  # stopped before: its pool was shut down
        self._stopping.clear()
        self._listener = NotifyListener(connect=self._listen_connect, channels={CHANNEL: self.wake})
        self._listener.start()
        self._thread = threading.Thread(target=self._loop, name="outboxkit-schedules", daemon=True)
        self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop the loop; ``wait`` also waits for the runs in progress to record their outcome."""
        self._stopping.set()
        self._alarm.wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop(wait=wait)
        self.runs.shutdown(wait=wait)

    def wake(self) -> None:
        """Look at the schedule rows now (a NOTIFY, a test that moved its clock)."""
        self._alarm.wake()

    def rearm(self, at: datetime | None) -> None:
        """Look at the schedule rows at ``at`` at the latest (None: now); a run that ends calls it.

        The loop's sleep left out the schedule whose run held its slot; this
        brings the sleep back to that schedule's next fire time.
        """
        if at is None:
            self._alarm.wake()
        else:
            self._alarm.rearm((at - self.database_time.now()).total_seconds())

    @property
    def loop_alive(self) -> bool:
        """True while the loop's thread is alive (False before ``start``, after ``stop``, or once it died)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def idle(self) -> bool:
        """Whether the loop is asleep, listening, with nothing due that it knows of."""
        listener = self._listener
        return self._idle.is_set() and listener is not None and listener.generation > 0 and not self._alarm.woken

    def _loop(self) -> None:
        try:
            self._turns()
        except BaseException:  # past the turn's own handler: the loop is gone, and /readyz says so (loop_alive)
            logger.exception(
                "the schedule loop died; this process fires no schedule row until it restarts",
                extra=log_fields("schedule.loop_died"),
            )

    def _turns(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._seconds_until_sweep() <= 0:
                    self._swept_at = time.monotonic()
                    self.sweep_expired_leases()
                if self._renewal_due():
                    self.renew_leases()
                firing = self.fire_due()
                wait = self.seconds_until_due()
                if firing.failed:
                    wait = max(wait, self.retry_seconds)
            except Exception as exc:  # the database is away: try again, never die
                logger.warning(
                    "schedule loop: %s; trying again in %g s", exc, self.retry_seconds,
                    extra=log_fields("schedule.loop_failed"),
                )
                wait = self.retry_seconds
            self._idle.set()
            self._alarm.sleep(wait)
            self._idle.clear()

    def _seconds_until_sweep(self) -> float:
        if self._swept_at is None:
            return 0.0
        return SWEEP_SECONDS - (time.monotonic() - self._swept_at)

    def _renewal_due(self) -> bool:
        return self._renewed_at is None or time.monotonic() - self._renewed_at >= self.lease_seconds / 3
