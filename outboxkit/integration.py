"""FastAPI (or any ASGI) integration: a lifespan that drains, fires schedule rows and runs the election.

::

    kit = OutboxKit(engine, outboxes=[CreditGrantOutbox])
    app = FastAPI(lifespan=kit.lifespan)

On start-up the lifespan starts this process's drain loops and their NOTIFY
listener (``OUTBOXKIT_DRAIN_ENABLED``, on by default; they claim at once,
leader or not), syncs the schedules declared in code into rows and starts
the trigger loop that fires this process's share of the due schedule rows
(``kit.schedules``, ``OUTBOXKIT_SCHEDULES_ENABLED``, on by default; no
leader needed), and starts campaigning for leadership in a background
thread, and returns: the API serves requests whether this worker leads,
stands by, or cannot reach the database at all.  A drain, schedule loop or
scheduler that fails to start is logged and never blocks the API (the
schedule loop syncs and starts in a thread, retried while the database does
not answer; a database whose kit migration predates the schedule tables is
one ERROR line naming the migration).  On shutdown it stops the schedule loop (runs in progress
record their outcome first), the drain loops (rows in flight are recorded
first), stops the scheduler, releases the lock and closes the kit, which
leaves it usable: a second start (another ``TestClient(app)``) works.
Blocking work runs in a thread, never on the event loop.

Probes for the application's own routes: ``liveness_app()`` (``/healthz``)
and ``readiness_app(kit)`` (``/readyz``: the drain loops run, when this
process drains, the database answers, and the schedule loop runs, when
this process fires schedule rows; 503 with the reason otherwise)::

    app.add_route("/healthz", liveness_app())
    app.add_route("/readyz", readiness_app(kit))

The application's own lifespan composes with it::

    @asynccontextmanager
    async def app_lifespan(app):
        async with kit.lifespan(app):
            yield  # the app's own start-up before, clean-up after
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Protocol

from outboxkit.drain.worker import database_readiness
from outboxkit.metrics.health import ProbeApp
from outboxkit.telemetry.log_events import log_fields

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outboxkit.drain.worker import DrainWorker
    from outboxkit.leader.scheduler import OutboxScheduler
    from outboxkit.schedules.runtime import KitSchedules
    from outboxkit.settings import OutboxKitSettings

__all__ = [
    "LOG_FORMAT",
    "Runtime",
    "kit_log_output",
    "lifespan",
    "liveness_app",
    "readiness",
    "readiness_app",
    "start_schedules",
    "stop_schedules",
]

logger = logging.getLogger(__name__)

# What a kit log line looks like where the kit gives its loggers their output (the lifespan, outboxkit worker).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def kit_log_output() -> None:
    """Give the kit's loggers an output with time, level and name when nothing configured logging.

    Under uvicorn (which configures only its own loggers) the kit's lines otherwise reach Python's last-resort
    handler: the message alone, and nothing below WARNING.  An application that configures logging (the root
    logger has a handler, or ``outboxkit``'s has) before its app starts keeps its own format.
    """
    kit = logging.getLogger(__package__)  # "outboxkit": the parent of every kit logger
    if logging.getLogger().handlers or kit.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    kit.addHandler(handler)
    if kit.level == logging.NOTSET:
        kit.setLevel(logging.INFO)


class Runtime(Protocol):
    """What the lifespan starts and stops: an ``OutboxKit`` (typed by shape, so this module sits below the kit)."""

    @property
    def settings(self) -> OutboxKitSettings: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def worker(self) -> DrainWorker: ...

    @property
    def scheduler(self) -> OutboxScheduler: ...

    @property
    def schedules(self) -> KitSchedules: ...

    def close(self) -> None: ...


def lifespan(kit: Runtime, *, close_kit: bool = True) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """An ASGI lifespan for ``FastAPI(lifespan=...)`` that drains, fires schedule rows, elects and cleans up.

    ``close_kit=False`` keeps the kit's thread pools and connections open
    after shutdown (when the application owns the kit beyond the app's life).
    """

    @asynccontextmanager
    async def run(app: object) -> AsyncIterator[None]:
        kit_log_output()
        await asyncio.to_thread(_start, kit)
        try:
            yield
        finally:
            await asyncio.to_thread(_stop, kit, close_kit)

    return run


def readiness(kit: Runtime, *, drains: Callable[[], str | None] | None = None) -> str | None:
    """None when this process is ready, else why not.

    Ready: its drain loops run (if ``OUTBOXKIT_DRAIN_ENABLED``), the
    database answers, and its schedule loop runs (if
    ``OUTBOXKIT_SCHEDULES_ENABLED``: ``KitSchedules.readiness``).  A loop
    the process is configured to run and does not is "not ready", as for
    the drains: the reason names it (docs/operations.md).  ``drains`` is
    the drain check of a process whose drain loops are not the kit's
    worker (``outboxkit worker``'s ``DrainWorker.readiness``).
    """
    if drains is not None:
        reason = drains()
    elif kit.settings.drain_enabled:
        reason = kit.worker.readiness()
    else:
        reason = database_readiness(kit.engine)
    if reason is None and kit.settings.schedules_enabled:
        reason = kit.schedules.readiness()
    return reason


def liveness_app() -> ProbeApp:
    """``app.add_route("/healthz", liveness_app())``: 200 ``ok`` while the process answers."""
    return ProbeApp()


def readiness_app(kit: Runtime) -> ProbeApp:
    """``app.add_route("/readyz", readiness_app(kit))``: 200 ``ready``, or 503 ``not ready: <reason>`` (``readiness``)."""
    return ProbeApp(lambda: readiness(kit))


def _start(kit: Runtime) -> None:
    if kit.settings.drain_enabled:
        try:
            kit.worker.start()
        except Exception:
            logger.exception("the drain loops could not start; the API starts without them",
                             extra=log_fields("integration.drain_start_failed"))
    else:
        logger.info("drain loops disabled (OUTBOXKIT_DRAIN_ENABLED=false) in this process",
                    extra=log_fields("integration.drain_disabled"))
    start_schedules(kit.schedules, enabled=kit.settings.schedules_enabled, where="the API")
    if not kit.settings.scheduler_enabled:
        logger.info("scheduler disabled (OUTBOXKIT_SCHEDULER_ENABLED=false) in this process",
                    extra=log_fields("integration.scheduler_disabled"))
        return
    try:
        kit.scheduler.elect()
    except Exception:
        logger.exception("the scheduler could not start; the API starts without it",
                         extra=log_fields("integration.scheduler_start_failed"))


def start_schedules(schedules: KitSchedules, *, enabled: bool, where: str) -> None:
    """Start the schedule loop in the background unless disabled; a refusal is logged (one line), never raised.

    Shared by the lifespan and ``outboxkit worker``: ``where`` names what
    goes on without the loop ("the API", "the worker").  The sync and the
    start run in a thread (``KitSchedules.start_in_background``), so a
    database that does not answer never holds up the start-up.
    """
    if not enabled:
        logger.info("schedule rows are not fired in this process (OUTBOXKIT_SCHEDULES_ENABLED=false)",
                    extra=log_fields("integration.schedules_disabled"))
        return
    try:
        schedules.start_in_background()
    except Exception:
        logger.exception("the schedule loop could not start; %s starts without it", where,
                         extra=log_fields("integration.schedules_start_failed"))


def stop_schedules(schedules: KitSchedules) -> None:
    """Stop the schedule loop (its runs record their outcome first); a failure is logged, never raised."""
    try:
        schedules.stop()
    except Exception:
        logger.exception("stopping the schedule loop failed", extra=log_fields("integration.schedules_stop_failed"))


def _stop(kit: Runtime, close_kit: bool) -> None:
    stop_schedules(kit.schedules)  # before the engine closes: its runs record their outcome
    try:
        kit.worker.stop()
    except Exception:
        logger.exception("stopping the drain loops failed", extra=log_fields("integration.drain_stop_failed"))
    try:
        kit.scheduler.resign()
    except Exception:
        logger.exception("stopping the scheduler failed", extra=log_fields("integration.scheduler_stop_failed"))
    if close_kit:
        kit.close()
