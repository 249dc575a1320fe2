"""Schedules as rows in the kit's processes: the schedules declared in code, and the trigger loop the kit runs.

``kit.schedules`` is where an application declares, in code, the schedules
whose state lives in ``outboxkit_schedules``::

    kit.schedules.add_job("billing.expire-trials", expire_trials,
                          ScheduleTrigger.cron(timezone="Europe/Berlin", hour=3, minute=30))
    kit.schedules.add_http("partner.heartbeat", ScheduleTrigger.every(minutes=5),
                           HttpTarget(url="https://partner.example/heartbeat", outbox="scheduled-calls"))
    kit.schedules.register_job("reports.rebuild", rebuild)   # a job only schedules made at runtime target

Every process that runs the kit's runtime (``kit.lifespan``, ``outboxkit
worker``) calls ``start_in_background()``, unless
``OUTBOXKIT_SCHEDULES_ENABLED=false``; in a thread of its own, so start-up
never waits for the database (one that does not answer is tried again every
few seconds until it does or ``stop()`` is called):

1. it checks that the kit's migration has the schedule tables (``outboxkit_0006``);
   a database behind it is one ERROR line (``start()`` raises
   ``MigrationRequired``) and the process goes on without the loop (drains
   and the elected scheduler are not held up by it);
2. it syncs the declared schedules into rows (``ScheduleStore.sync_from_code``
   with ``remove_missing=True``): new ones are inserted, changed ones updated
   (their ``enabled`` kept, their ``next_run_at`` too when the trigger is
   unchanged), and a row that an earlier start declared in code but this
   code no longer declares is deleted (audited as ``sync``; its run history
   stays);
3. it starts a ``ScheduleRunner`` with the registered job functions, the
   kit's outboxes, clock and telemetry: it fires this process's share of
   every due row (``outboxkit.schedules.runner``).

``stop()`` cancels a start in progress and waits for the runs in progress
to record their outcome; the kit stops it before it closes its engine.  A
kit runs one loop per process: a second start while it runs or starts
raises ``LifecycleError``; after ``stop()`` it starts again (a second
``TestClient(app)``).

Names are shared with the elected scheduler's job ids (both write their runs
into ``outboxkit_job_runs`` under that name, and the fence keys on it), so a
schedule named like an elected job, or under the kit's ``outboxkit.``
prefix, is refused when it is declared (``ConfigurationError``), and so is
the other way round (``kit.scheduler.add_job``).

In tests, ``run_pending()`` and ``run_job(name)`` drive the same runner by
hand on the kit's (manual) clock, after syncing the declared schedules.

One module, past 400 lines: ``KitSchedules`` is the one object the kit hands out for schedules (declaring,
syncing, starting and stopping the loop), and splitting it would split that one lifecycle.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Collection
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text

from outboxkit.drain.pooler_checks import check_engine
from outboxkit.errors import ConfigurationError, LifecycleError, MigrationRequired, error_summary, first_line
from outboxkit.results import RunRecord
from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import KIT_JOB_PREFIX, JobFunction, check_job_function
from outboxkit.schedules.runner import Firing, ScheduleRunner, default_holder
from outboxkit.schedules.store import ScheduleStore
from outboxkit.storage.pooler_verdict import stop_when_refused
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore

__all__ = ["KitSchedules"]

logger = logging.getLogger(__name__)

SCHEDULE_TABLES = ("outboxkit_schedules", "outboxkit_schedule_leases")
_MISSING_TABLES = text("SELECT name FROM unnest(CAST(:names AS text[])) AS name WHERE to_regclass(name) IS NULL")
# The newest schedule column (migration outboxkit_0010): a database without it cannot claim.
_NEWEST_COLUMN = text(
    "SELECT count(*) FROM information_schema.columns "
    "WHERE table_name = 'outboxkit_schedules' AND column_name = 'run_now_pending' "
    "AND table_schema = ANY(current_schemas(false))"
)


class KitSchedules:
    """The schedules a kit declares in code, and this process's ``ScheduleRunner``; see the module docstring.

    ``elected_job_ids`` returns the ids of the elected scheduler's jobs, so a
    declared name that collides with one is refused.
    """

    def __init__(self, kit: KitCore, *, elected_job_ids: Callable[[], Collection[str]]) -> None:
        self.kit = kit
        self._elected_job_ids = elected_job_ids
        self._lock = threading.RLock()
        self._jobs: dict[str, JobFunction] = {}
        self._definitions: dict[str, ScheduleDefinition] = {}
        self._origins: dict[str, str] = {}  # where the code declares each schedule ("module:line")
        self._runner: ScheduleRunner | None = None  # built from the registry; rebuilt after it changes
        self._running = False
        self._synced = False
        self._starter: threading.Thread | None = None  # start_in_background's thread while it starts
        self._cancel = threading.Event()
        self._start_problem: str | None = None  # why the last start in the background failed, for readiness()
        # A refusal by any of the kit's checks stops the schedule loop too.
        stop_when_refused(
            kit.pooler_verdict, running=lambda: self.running, stop=self.stop, what="the schedule loop", event="schedule.refused"
        )

    # -- declaring -----------------------------------------------------------

    def register_job(self, name: str, function: JobFunction) -> None:
        """Register ``function`` under ``name``: schedules (declared here or made at runtime) may target it.

        A job is ``def job(context: JobContext)``, sync or async, returning
        counts or None (``outboxkit.schedules.jobs``).  Whichever process
        claims an occurrence looks the function up by this name, so register
        it in every process that runs the kit.
        """
        JobTarget(job=name)  # the name's rules (InvalidScheduleError naming target.job)
        check_job_function(name, function)
        with self._lock:
            self._refuse_while_running(f"register the job {name!r}")
            self._jobs[name] = function
            self._changed()

    def add_job(
        self,
        name: str,
        function: JobFunction,
        trigger: ScheduleTrigger,
        *,
        misfire_grace_seconds: int = 300,
        max_running: int = 1,
        rerun_if_abandoned: bool = False,
    ) -> ScheduleDefinition:
        """Declare a schedule that runs ``function`` (registered as job ``name``) on ``trigger``.

        Synced into a row at every start; see ``ScheduleDefinition`` for the
        limits.  A name taken by another declared schedule or by an elected
        job is refused with a ``ConfigurationError``.
        """
        definition = ScheduleDefinition(
            name=name, trigger=trigger, target=JobTarget(job=name), misfire_grace_seconds=misfire_grace_seconds,
            max_running=max_running, rerun_if_abandoned=rerun_if_abandoned,
        )
        check_job_function(name, function)
        with self._lock:
            self._declare(definition, _declaration_site())
            self._jobs[name] = function
            self._changed()
        return definition

    def add_http(
        self,
        name: str,
        trigger: ScheduleTrigger,
        target: HttpTarget,
        *,
        misfire_grace_seconds: int = 300,
    ) -> ScheduleDefinition:
        """Declare a schedule that enqueues the request ``target`` into its outbox on ``trigger``.

        ``target.outbox`` is the ``job_name`` of one of the kit's
        ``ScheduledRequestOutbox`` classes (checked when it is synced).
        """
        definition = ScheduleDefinition(name=name, trigger=trigger, target=target, misfire_grace_seconds=misfire_grace_seconds)
        with self._lock:
            self._declare(definition, _declaration_site())
            self._changed()
        return definition

    @property
    def definitions(self) -> list[ScheduleDefinition]:
        """The schedules declared in code, in the order they were declared."""
        with self._lock:
            return list(self._definitions.values())

    @property
    def jobs(self) -> dict[str, JobFunction]:
        """The registered job functions by name."""
        with self._lock:
            return dict(self._jobs)

    def claimed_name(self, job_id: str) -> str | None:
        """Why ``job_id`` cannot be an elected job's id (a schedule declared here has it), or None."""
        with self._lock:
            if job_id in self._definitions:
                return (
                    f"{job_id!r} is the name of a schedule declared with kit.schedules; the elected scheduler's "
                    "job ids and schedule names share the run history and its fence: choose another id"
                )
        return None

    # -- the rows and the loop -------------------------------------------------

    @property
    def store(self) -> ScheduleStore:
        """A ``ScheduleStore`` on the kit's engine and clock that knows the registered jobs and the kit's outboxes.

        It refuses (``InvalidScheduleError``, field ``name``) a schedule named like an elected job or
        under the kit's ``outboxkit.`` prefix, as declaring one in code does.
        """
        return ScheduleStore(
            self.kit.engine, clock=self.kit.clock, jobs=self.jobs, outboxes=self.kit.outboxes,
            reserved_names=self._reserved_name, url_guard=self.kit.url_guard,
            run_now_per_minute=self.kit.settings.schedule_run_now_per_minute, secret_names=self.kit.settings.secrets,
        )

    @property
    def runner(self) -> ScheduleRunner:
        """This process's runner (the one ``start()`` runs, or one to drive by hand while it is not started)."""
        with self._lock:
            if self._runner is None:
                holder = default_holder()
                self._runner = ScheduleRunner(
                    self.kit.engine,
                    jobs=self._jobs,
                    outboxes=self.kit.outboxes,
                    clock=self.kit.clock,
                    holder=holder,
                    history_limit=self.kit.settings.job_history_limit,
                    listen_connect=self.kit.session_connector(f"outboxkit-schedules:{holder}"[:63]),
                    telemetry=self.kit.telemetry,
                )
            return self._runner

    @property
    def running(self) -> bool:
        with self._lock:
            return self._running

    def readiness(self) -> str | None:
        """None while this process's trigger loop runs, else why not (``/readyz``: see docs/operations.md).

        The reasons: the loop has stopped (its thread died, or its runner
        was stopped under the kit), it is starting (the last attempt's
        error when the database did not answer), it did not start (the
        schedule tables are missing: the migration to run), or it is not
        running (never started, or ``stop()``).
        """
        with self._lock:
            running, runner, starter, problem = self._running, self._runner, self._starter, self._start_problem
        if running:
            return None if runner is not None and runner.loop_alive else "the schedule loop has stopped"
        if starter is not None and starter.is_alive():
            return "the schedule loop is starting" + (f" (the last attempt failed: {problem})" if problem else "")
        if problem is not None:
            return f"the schedule loop did not start: {problem}"
        return "the schedule loop is not running"

    def check_tables(self) -> None:
        """Raise ``MigrationRequired`` when the database's kit migration predates the schedule tables."""
        with self.kit.engine.connect() as connection:
            missing = list(connection.execute(_MISSING_TABLES, {"names": list(SCHEDULE_TABLES)}).scalars())
            if not missing and not connection.execute(_NEWEST_COLUMN).scalar_one():
                missing = ["outboxkit_schedules.run_now_pending"]
        if missing:
            raise MigrationRequired(
                f"schedules as rows need the kit's migration outboxkit_0010 ({', '.join(missing)} missing): "
                "run `alembic upgrade heads` with outboxkit:migrations/versions in version_locations, "
                "or set OUTBOXKIT_SCHEDULES_ENABLED=false to run without them"
            )

    def sync(self) -> dict[str, int]:
        """Write the declared schedules into rows and delete the rows of schedules no longer declared in code.

        Returns how many were inserted, updated, unchanged and removed.
        """
        self.check_tables()
        with self._lock:
            origins = dict(self._origins)
        counts = self.store.sync_from_code(self.definitions, remove_missing=True, origins=origins)
        with self._lock:
            self._synced = True
        if counts["inserted"] or counts["updated"] or counts["removed"]:
            logger.info(
                "schedules defined in code: %d inserted, %d updated, %d removed, %d unchanged",
                counts["inserted"], counts["updated"], counts["removed"], counts["unchanged"],
                extra=log_fields("schedule.synced", counts=counts),
            )
        return counts

    def start(self) -> None:
        """Check the tables, sync the declared schedules and start the trigger loop, in this thread.

        Raises ``MigrationRequired`` (nothing started) when the schedule
        tables are missing, ``LifecycleError`` when this kit's loop already
        runs (or is starting) in this process; a database error propagates.
        """
        with self._lock:
            self._refuse_while_running("start it again")
            self._refuse_while_starting()
        self._start(threading.Event())

    def start_in_background(self, *, retry_seconds: float = 5.0) -> None:
        """What the lifespan and ``outboxkit worker`` call: ``start()`` in a thread, so start-up never waits for it.

        A database that does not answer is tried again every
        ``retry_seconds`` (a WARNING the first time) until it does or
        ``stop()`` is called; missing schedule tables are one ERROR line
        (``schedule.needs_migration``) and the process goes on without the
        loop.  ``LifecycleError`` at once if the loop runs or is starting.
        """
        with self._lock:
            self._refuse_while_running("start it again")
            self._refuse_while_starting()
            cancel = threading.Event()
            self._cancel = cancel
            self._starter = threading.Thread(
                target=self._start_until_done, args=(cancel, retry_seconds), name="outboxkit-schedules-start", daemon=True
            )
            self._starter.start()

    def stop(self, *, timeout: float = 60.0) -> None:
        """Stop the loop and wait for the runs in progress to record their outcome.  Idempotent.

        A start still in progress is cancelled (it starts nothing after
        this); a runner driven by hand (``run_pending``) has its run threads
        released too.
        """
        with self._lock:
            self._cancel.set()
            starter, self._starter = self._starter, None
            self._start_problem = None
        if starter is not None and starter is not threading.current_thread():
            starter.join(timeout)  # a sync in progress ends, or its connection attempt fails
        with self._lock:
            runner, was_running = self._runner, self._running
            self._running = False
            self._runner = None  # its thread pool is shut down: the next use builds a fresh one
        if runner is None:
            return
        runner.stop(wait=True)
        if was_running:
            logger.info("stopped firing schedule rows", extra=log_fields("schedule.runner_stopped"))

    def _start(self, cancel: threading.Event) -> bool:
        """Sync, then start the runner unless ``cancel`` was set meanwhile; whether it started."""
        check_engine(self.kit)  # the loop claims and fires through the engine: the kit's pooler verdict applies
        self.sync()
        with self._lock:
            if cancel.is_set():
                return False
            self._refuse_while_running("start it again")
            runner = self.runner
            runner.start()
            self._running = True
            self._start_problem = None
        logger.info(
            "firing schedule rows in this process (%d declared in code, %d job(s) registered)",
            len(self._definitions), len(self._jobs),
            extra=log_fields("schedule.runner_started", declared=len(self._definitions), jobs=len(self._jobs)),
        )
        return True

    def _start_until_done(self, cancel: threading.Event, retry_seconds: float) -> None:
        warned = False
        while not cancel.is_set():
            try:
                self._start(cancel)
                return
            except MigrationRequired as exc:  # a database behind the kit's migration: the fix, in one line
                logger.error("the schedule loop did not start: %s; this process goes on without it", exc,
                             extra=log_fields("schedule.needs_migration"))
                self._record_start_problem(cancel, str(exc))
                return
            except ConfigurationError as exc:  # the kit refused its engine (production): final, no retries
                logger.error("the schedule loop did not start: %s", exc, extra=log_fields("schedule.refused"))
                self._record_start_problem(cancel, str(exc))
                return
            except Exception as exc:
                self._record_start_problem(cancel, error_summary(exc)[:300])
                if not warned:
                    logger.warning("the schedule loop could not start yet (%s: %s); trying again every %g s",
                                   type(exc).__name__, first_line(exc), retry_seconds,
                                   extra=log_fields("schedule.start_retrying"))
                    warned = True
            cancel.wait(retry_seconds)

    def _record_start_problem(self, cancel: threading.Event, problem: str) -> None:
        """Why the start failed, for ``readiness()``; a start that ``stop()`` cancelled meanwhile leaves no reason."""
        with self._lock:
            if not cancel.is_set():
                self._start_problem = problem

    # -- driving it by hand (tests) ----------------------------------------------

    def run_pending(self, *, timeout: float = 60.0) -> Firing:
        """One turn of the loop at the kit clock's time (see ``ScheduleRunner.run_pending``), after a sync.

        With ``OutboxKit(..., clock=ManualClock())``::

            clock.advance(hours=1)
            firing = kit.schedules.run_pending()   # fires what is due and waits for the runs
        """
        self._sync_once()
        return self.runner.run_pending(timeout=timeout)

    def run_job(self, name: str, *, scheduled_for: datetime | None = None) -> RunRecord:
        """Run one occurrence of the schedule ``name`` now, in this thread (``ScheduleRunner.run_job``), after a sync."""
        self._sync_once()
        return self.runner.run_job(name, scheduled_for=scheduled_for)

    # -- internals -----------------------------------------------------------

    def _reserved_name(self, name: str) -> str | None:
        """Why no schedule may be named ``name`` (the kit's prefix, an elected job's id), or None."""
        if name.startswith(KIT_JOB_PREFIX):
            return (
                f"schedule {name!r}: names starting with {KIT_JOB_PREFIX!r} are the kit's own (drains, retention); "
                "use your application's own prefix, e.g. 'billing.expire-trials'"
            )
        if name in self._elected_job_ids():
            return (
                f"schedule {name!r}: the elected scheduler has a job with this id (kit.scheduler.add_job); "
                "schedule names and job ids share the run history and its fence: rename one of them"
            )
        return None

    def _declare(self, definition: ScheduleDefinition, origin: str) -> None:
        name = definition.name
        self._refuse_while_running(f"declare the schedule {name!r}")
        if name in self._definitions:
            raise ConfigurationError(f"schedule {name!r} is declared twice with kit.schedules; each name once")
        reserved = self._reserved_name(name)
        if reserved is not None:
            raise ConfigurationError(reserved)
        self._definitions[name] = definition
        self._origins[name] = origin

    def _changed(self) -> None:
        """The registry changed: the next sync and runner see it."""
        self._runner = None
        self._synced = False

    def _refuse_while_starting(self) -> None:
        starter = self._starter
        if starter is not None and starter.is_alive() and starter is not threading.current_thread():
            raise LifecycleError(
                "cannot start it again: this kit's schedule loop is starting in this process (kit.lifespan or "
                "outboxkit worker started it); stop it first"
            )

    def _refuse_while_running(self, what: str) -> None:
        if self._running:
            raise LifecycleError(
                f"cannot {what}: this kit's schedule loop is running in this process (kit.lifespan or "
                "outboxkit worker started it); declare schedules before the kit starts, or stop it first"
            )

    def _sync_once(self) -> None:
        with self._lock:
            synced = self._synced
        if not synced:
            self.sync()


def _declaration_site() -> str:
    """Where the application's code called ``add_job`` or ``add_http``: ``module:line`` of the first frame outside
    outboxkit (a script's file name for ``__main__``), the same in every process that runs that code."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "outboxkit":
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "")
    if not module or module == "__main__":
        module = Path(frame.f_code.co_filename).name
    return f"{module}:{frame.f_lineno}"
