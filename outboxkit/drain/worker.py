"""Drain work in this process: a background loop per outbox, woken by NOTIFY.

Drains are safe to run concurrently (SKIP LOCKED, the lease, the claim
token guard), so drain work does not wait for leadership.  A ``DrainWorker``
runs in every process that enables it (``OutboxKitSettings.drain_enabled``,
on by default):

* each outbox's ``Drainer`` runs its background loop (``Drainer.start``): it
  claims at once on start, on every wake-up, and whenever a row comes due
  (a retry at its backoff time, a scheduled one-shot send, a dead worker's
  lease running out), and polls every ``drain_interval_seconds`` anyway;
* one ``NotifyListener`` connection LISTENs on every outbox's channel and
  wakes that outbox's loop: an insert (the trigger or ``notify_statement``)
  and an admin reset both notify, so the time from commit to send is
  milliseconds.  Each (re)connection wakes every loop once, to catch up on
  notifications sent while nobody listened.  It also LISTENs on
  ``outboxkit.storage.pauses.PAUSES_CHANNEL``: while it is connected, the drainers
  keep their pause answer until a pause or resume notifies (``PauseCheck.follow``),
  so an insert's wake-up goes straight to the claim.

The application's processes get one through ``kit.lifespan``; dedicated
drainer processes on any number of hosts run ``outboxkit worker --app
module:kit``, which is ``DrainWorker(kit).run_until_stopped()`` with SIGTERM
and SIGINT handled, beside the kit's schedule loop (``kit.schedules``, as
in the lifespan).  The elected leader keeps the kit's internal jobs: the
safety-net drain job and housekeeping (``outboxkit.leader.scheduler``).

LISTEN holds session state for hours: through PgBouncer, point
``OUTBOXKIT_LOCK_DATABASE_URL`` at the database or at a session-mode pool.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from types import FrameType
from typing import TYPE_CHECKING

from outboxkit.drain.pooler_checks import check_engine, check_outbox_tables, session_source_accepted
from outboxkit.errors import error_summary
from outboxkit.model import Outbox
from outboxkit.storage.notify import NotifyListener, channel_for, listener_application_name
from outboxkit.storage.pauses import PAUSES_CHANNEL
from outboxkit.storage.pooler_verdict import stop_when_refused
from outboxkit.telemetry.hooks import log_fields

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outboxkit.drain.drainer import Drainer
    from outboxkit.drain.kit_core import KitCore

__all__ = ["DrainWorker", "database_readiness"]

logger = logging.getLogger(__name__)


def database_readiness(engine: Engine) -> str | None:
    """None when the database answers ``SELECT 1``, else why not (one line)."""
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as exc:
        return f"the database does not answer: {error_summary(exc)}"
    return None


def _pauses_changed(drainers: list[Drainer]) -> None:
    """A pause or resume committed somewhere: every drainer reads its answer again, and a resume claims at once."""
    for drainer in drainers:
        drainer.pause_check.forget()
        drainer.wake()


class DrainWorker:
    """Runs the drain loops of a kit's outboxes (all, or the ones named) and their listener.

    ``start()`` returns at once; ``stop()`` stops claiming and waits for the
    rows in flight (each send ends by its deadline).  A stopped worker can be
    started again.
    """

    def __init__(self, kit: KitCore, *, outboxes: Iterable[str | type[Outbox]] | None = None) -> None:
        self.kit = kit
        self.outboxes = [kit.outbox(name) for name in outboxes] if outboxes is not None else kit.drained_outboxes
        self._lock = threading.Lock()
        self._drainers: list[Drainer] = []
        self._listener: NotifyListener | None = None
        self._stopped = threading.Event()
        # A refusal by any of the kit's checks stops the drain loops too.
        stop_when_refused(
            kit.pooler_verdict, running=lambda: self.running, stop=self.stop, what="the drain loops", event="worker.refused"
        )

    @property
    def running(self) -> bool:
        with self._lock:
            return bool(self._drainers)

    @property
    def listener(self) -> NotifyListener | None:
        """The LISTEN connection's thread while running with ``listen_enabled``."""
        return self._listener

    @property
    def drainers(self) -> list[Drainer]:
        with self._lock:
            return list(self._drainers)

    def start(self) -> None:
        """Start every loop (each claims at once) and the listener.  Idempotent."""
        settings = self.kit.settings
        if self.running:
            return
        check_engine(self.kit)  # an engine that prepares through a transaction pool (production raises)
        check_outbox_tables(self.kit, list(self.outboxes))  # a table older than the destination column raises
        if not self.outboxes:  # a receive-only kit (OutboxKit.receive_only): no loop, nothing to listen for
            logger.info(
                "nothing to drain in this process: the kit only receives",
                extra=log_fields("worker.started", outboxes=[]),
            )
            return
        # A LISTEN through a transaction-mode pooler hears almost nothing: refused before anything
        # starts (production raises), else the loops run on due times and polling alone.
        listen = settings.listen_enabled and session_source_accepted(
            self.kit, listener_application_name(), purpose="the LISTEN connection"
        )
        with self._lock:
            if self._drainers:
                return
            self._stopped.clear()
            drainers = [self.kit.drainer(outbox) for outbox in self.outboxes]
            for drainer in drainers:
                drainer.start(poll_seconds=settings.drain_interval_seconds)
            self._drainers = drainers
            if listen:
                channels = {channel_for(drainer.outbox): drainer.wake for drainer in drainers}
                channels[PAUSES_CHANNEL] = lambda: _pauses_changed(drainers)
                telemetry = self.kit.telemetry

                def connection_changed(connected: bool, reconnected: bool) -> None:
                    for drainer in drainers:  # after LISTEN (or its loss): see PauseCheck.follow
                        drainer.pause_check.follow(connected)
                    telemetry.listener_changed(connected=connected, reconnected=reconnected)

                self._listener = NotifyListener(
                    connect=self.kit.session_connector(listener_application_name()),
                    channels=channels,
                    source=self.kit.session_source,
                    on_connection=connection_changed,
                )
                self._listener.start()
        logger.info(
            "draining %s in this process%s",
            ", ".join(drainer.job_name for drainer in drainers),
            " (woken by NOTIFY)" if listen else " (no NOTIFY: due times and polling only)",
            extra=log_fields("worker.started", outboxes=[drainer.job_name for drainer in drainers]),
        )

    def readiness(self) -> str | None:
        """None when this worker is ready (its drain loops run and the database answers), else why not.

        What ``/readyz`` of ``outboxkit worker --metrics-port`` reports
        (503 with the reason); ``/healthz`` only says the process answers.
        """
        drainers = self.drainers
        if not self.outboxes:  # a receive-only kit has no loop to run
            return database_readiness(self.kit.engine)
        if not drainers:
            return "the drain loops are not running"
        stopped = [drainer.job_name for drainer in drainers if not drainer.loop_alive]
        if stopped:
            return f"the drain loop of {', '.join(stopped)} has stopped"
        return database_readiness(self.kit.drain_database.engine)

    def wake(self) -> None:
        """Wake every loop now (as a notification would)."""
        for drainer in self.drainers:
            drainer.wake()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the listener, then every loop; rows in flight are sent and recorded first."""
        with self._lock:
            drainers, self._drainers = self._drainers, []
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
        for drainer in drainers:
            drainer.stop(wait=False)  # all stop claiming at once; then wait for each
        for drainer in drainers:
            drainer.stop(timeout)
        if drainers:
            logger.info(
                "stopped draining %s",
                ", ".join(drainer.job_name for drainer in drainers),
                extra=log_fields("worker.stopped", outboxes=[drainer.job_name for drainer in drainers]),
            )
        self._stopped.set()

    def run_until_stopped(self, *, handle_signals: bool = True) -> None:
        """Start, then block until SIGTERM or SIGINT (or ``stop()`` from another thread); stop cleanly.

        Signal handlers can only be installed from the main thread; pass
        ``handle_signals=False`` elsewhere.
        """
        stop_requested = threading.Event()
        previous: dict[int, object] = {}
        if handle_signals:

            def request_stop(signum: int, frame: FrameType | None) -> None:
                logger.info(
                    "received %s; finishing the rows in flight",
                    signal.Signals(signum).name,
                    extra=log_fields("worker.signal", signal=signal.Signals(signum).name),
                )
                stop_requested.set()

            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, request_stop)
        self.start()
        try:
            while not stop_requested.is_set() and not self._stopped.is_set():
                stop_requested.wait(0.5)
        finally:
            self.stop()
            for number, handler in previous.items():
                signal.signal(number, handler)  # type: ignore[arg-type]
