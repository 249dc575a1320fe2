"""FastAPI (or any ASGI) integration: a lifespan that drains and runs the election.

::

    kit = OutboxKit(engine, outboxes=[CreditGrantOutbox])
    app = FastAPI(lifespan=kit.lifespan)

On start-up the lifespan starts this process's drain loops and their NOTIFY
listener (``OUTBOXKIT_DRAIN_ENABLED``, on by default; they claim at once,
leader or not) and starts campaigning for leadership in a background thread,
and returns at once: the API serves requests whether this worker leads,
stands by, or cannot reach the database at all.  A drain or scheduler that
fails to start is logged and never blocks the API.  On shutdown it stops the
drain loops (rows in flight are recorded first), stops the scheduler,
releases the lock and closes the kit, which leaves it usable: a second
start (another ``TestClient(app)``) works.  Blocking work runs in a thread,
never on the event loop.

Probes for the application's own routes: ``liveness_app()`` (``/healthz``)
and ``readiness_app(kit)`` (``/readyz``: the drain loops run, when this
process drains, and the database answers; 503 with the reason otherwise)::

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

from outboxkit.health import ProbeApp
from outboxkit.log_events import log_fields
from outboxkit.worker import database_readiness

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outboxkit.scheduler import OutboxScheduler
    from outboxkit.settings import OutboxKitSettings
    from outboxkit.worker import DrainWorker

__all__ = ["Runtime", "lifespan", "liveness_app", "readiness", "readiness_app"]

logger = logging.getLogger("outboxkit.integration")


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

    def close(self) -> None: ...


def lifespan(kit: Runtime, *, close_kit: bool = True) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """An ASGI lifespan for ``FastAPI(lifespan=...)`` that drains, elects, schedules and cleans up.

    ``close_kit=False`` keeps the kit's thread pools and connections open
    after shutdown (when the application owns the kit beyond the app's life).
    """

    @asynccontextmanager
    async def run(app: object) -> AsyncIterator[None]:
        await asyncio.to_thread(_start, kit)
        try:
            yield
        finally:
            await asyncio.to_thread(_stop, kit, close_kit)

    return run


def readiness(kit: Runtime) -> str | None:
    """None when this process is ready, else why not: its drain loops run (if enabled) and the database answers."""
    if kit.settings.drain_enabled:
        return kit.worker.readiness()
    return database_readiness(kit.engine)


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
    if not kit.settings.scheduler_enabled:
        logger.info("scheduler disabled (OUTBOXKIT_SCHEDULER_ENABLED=false) in this process",
                    extra=log_fields("integration.scheduler_disabled"))
        return
    try:
        kit.scheduler.elect()
    except Exception:
        logger.exception("the scheduler could not start; the API starts without it",
                         extra=log_fields("integration.scheduler_start_failed"))


def _stop(kit: Runtime, close_kit: bool) -> None:
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
