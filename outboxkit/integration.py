"""FastAPI (or any ASGI) integration: a lifespan that runs the election.

::

    kit = OutboxKit(engine, outboxes=[CreditGrantOutbox])
    app = FastAPI(lifespan=kit.lifespan)

On start-up the lifespan starts campaigning for leadership in a background
thread and returns at once: the API serves requests whether this worker
leads, stands by, or cannot reach the lock at all.  A scheduler that fails to
start is logged and never blocks the API.  On shutdown it stops the
scheduler, releases the lock and closes the kit.  Blocking work runs in a
thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outboxkit.kit import OutboxKit

__all__ = ["lifespan"]

logger = logging.getLogger("outboxkit.integration")


def lifespan(kit: OutboxKit, *, close_kit: bool = True) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """An ASGI lifespan for ``FastAPI(lifespan=...)`` that elects, schedules and cleans up.

    ``close_kit=False`` keeps the kit open after shutdown (when the
    application owns it beyond the app's life, e.g. in tests).
    """

    @asynccontextmanager
    async def run(app: object) -> AsyncIterator[None]:
        await asyncio.to_thread(_start, kit)
        try:
            yield
        finally:
            await asyncio.to_thread(_stop, kit, close_kit)

    return run


def _start(kit: OutboxKit) -> None:
    if not kit.settings.scheduler_enabled:
        logger.info("scheduler disabled (OUTBOXKIT_SCHEDULER_ENABLED=false); this process only serves")
        return
    try:
        kit.scheduler.elect()
    except Exception:
        logger.exception("the scheduler could not start; the API starts without it")


def _stop(kit: OutboxKit, close_kit: bool) -> None:
    try:
        kit.scheduler.resign()
    except Exception:
        logger.exception("stopping the scheduler failed")
    if close_kit:
        kit.close()
