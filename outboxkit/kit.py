"""The kit: the one object an application creates and keeps.

``OutboxKit`` is ``KitCore`` (engine, outboxes, drainers, transport, clock,
telemetry: ``outboxkit.drain.kit_core``) plus the runtime built on top of it: the
drain loops of this process (``kit.worker``), the job registry and elected
scheduler (``kit.scheduler``), the schedules as rows declared in code and
this process's trigger loop (``kit.schedules``) and the ASGI lifespan that
starts and stops them (``kit.lifespan``).  The runtime modules take a ``KitCore`` and never
import this module, so the layers point one way: core, then runtime, then
the kit.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from outboxkit.clock import Clock
from outboxkit.drain.kit_core import KitCore
from outboxkit.drain.worker import DrainWorker
from outboxkit.events.deliveries import EventDelivery
from outboxkit.events.runtime import KitEvents, require_deliveries_outbox
from outboxkit.integration import lifespan
from outboxkit.model import Outbox
from outboxkit.schedules.runtime import KitSchedules
from outboxkit.settings import OutboxKitSettings
from outboxkit.transports.base import Transport

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from outboxkit.leader.scheduler import OutboxScheduler

__all__ = ["OutboxKit"]


class OutboxKit(KitCore):
    """Durable delivery for a set of outbox classes on one PostgreSQL database.

    ::

        kit = OutboxKit(engine, outboxes=[CreditGrant])
        kit.drain_once(CreditGrant)   # or let the scheduler do it
        kit.close()

    ``engine`` is a sync ``postgresql+psycopg://`` engine (``outboxkit.database_url``
    turns the URL you have into that form); another driver is refused.  An
    ``AsyncEngine`` is accepted: the kit then builds its own sync psycopg
    engine on the same database and disposes it at ``close()`` (see
    ``outboxkit.storage.database`` and docs/async.md).

    ``transport`` defaults to one shared ``HttpTransport``; an outbox whose
    options name a transport uses that one.  ``settings`` defaults to
    ``OutboxKitSettings.from_environment()``; a bad variable fails here, named.
    """

    def __init__(
        self,
        engine: Engine | AsyncEngine,
        outboxes: Iterable[type[Outbox]],
        *,
        settings: OutboxKitSettings | None = None,
        clock: Clock | None = None,
        transport: Transport | None = None,
        receive_only: bool = False,
    ) -> None:
        super().__init__(engine, outboxes, settings=settings, clock=clock, transport=transport, receive_only=receive_only)
        self._scheduler: OutboxScheduler | None = None
        self._worker: DrainWorker | None = None
        self._schedules: KitSchedules | None = None
        self._events: KitEvents | None = None

    @classmethod
    def receive_only(
        cls,
        engine: Engine | AsyncEngine,
        *,
        settings: OutboxKitSettings | None = None,
        clock: Clock | None = None,
    ) -> OutboxKit:
        """A kit for a service that only receives (the inbox, docs/inbox.md): no outboxes, nothing to drain.

        Its lifespan elects a leader that runs the inbox's retention
        (``OUTBOXKIT_INBOX_RETENTION_DAYS``), your jobs and your schedules; the
        admin shows its Inbox page and ``OutboxMetrics(kit)`` its inbox
        metrics.  What needs an outbox (``drain_once``, ``outbox``,
        ``options``, a drain worker) raises ``UnknownOutboxError`` saying so.
        """
        return cls(engine, (), settings=settings, clock=clock, receive_only=True)

    @property
    def worker(self) -> DrainWorker:
        """The drain loops of every outbox in this process and their NOTIFY listener (``outboxkit.drain.worker``)."""
        with self._lock:
            if self._worker is None:
                self._worker = DrainWorker(self)
            return self._worker

    @property
    def scheduler(self) -> OutboxScheduler:
        """The job registry and elected scheduler (one drain job per outbox, plus your own jobs)."""
        with self._lock:
            if self._scheduler is None:
                # Imported here: a process that only drains (``outboxkit worker``) never loads APScheduler's
                # scheduler and executors, nor the election.
                from outboxkit.leader.scheduler import OutboxScheduler

                self._scheduler = OutboxScheduler(self, reserved_ids=lambda id: self.schedules.claimed_name(id))
            return self._scheduler

    @property
    def schedules(self) -> KitSchedules:
        """Schedules as rows: declare them in code (``add_job``, ``add_http``) and fire them in every process.

        See ``outboxkit.schedules.runtime`` and docs/schedules.md; the lifespan
        and ``outboxkit worker`` start its loop (``OUTBOXKIT_SCHEDULES_ENABLED``).
        """
        with self._lock:
            if self._schedules is None:
                self._schedules = KitSchedules(self, elected_job_ids=self._elected_job_ids)
            return self._schedules

    @property
    def events(self) -> KitEvents:
        """Events and subscriptions (``outboxkit.events.runtime``), when ``EventDelivery`` is registered.

        ``kit.events.subscriptions`` creates, edits, disables and deletes subscriptions; ``kit.events.catalog``
        defines event types.  Without ``EventDelivery`` among the outboxes it raises ``ConfigurationError``.
        """
        require_deliveries_outbox(self)
        with self._lock:
            if self._events is None:
                self._events = KitEvents(self, _built_by_kit=True)
            return self._events

    def _outbox_transport(self, outbox: type[Outbox], transport: Transport) -> Transport:
        # The deliveries outbox signs each row with its own subscription's secrets, in every process.
        return self.events.signing(transport) if outbox is EventDelivery else transport

    def lifespan(self, app: object) -> AbstractAsyncContextManager[None]:
        """ASGI lifespan: ``FastAPI(lifespan=kit.lifespan)``.  See ``outboxkit.integration``."""
        return lifespan(self)(app)

    def _elected_job_ids(self) -> set[str]:
        return {job.id for job in self.scheduler.jobs()}

    def close(self) -> None:
        """Stop the schedule loop, draining and the scheduler, finish runs and sends in flight, release pools and connections.

        Like ``Engine.dispose()``, it leaves the kit usable: the next drain
        (or the next ``lifespan`` start, e.g. a second ``TestClient(app)``)
        builds fresh drainers and a fresh transport.
        """
        with self._lock:
            worker, scheduler, schedules = self._worker, self._scheduler, self._schedules
        if schedules is not None:  # its runs record their outcome while the engine is open
            schedules.stop()
        if worker is not None:
            worker.stop()
        if scheduler is not None:
            scheduler.resign()
        super().close()

    def __enter__(self) -> OutboxKit:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
