"""Prometheus metrics for one kit: lag, failures, the leader and the jobs.

(A few lines past 400: every metric is defined in one place, ``_define``, beside the hooks that feed it, so
its name, labels and meaning are read together; the HTTP exporter for workers is ``outboxkit.metrics.health``.)

::

    from outboxkit.metrics.prometheus import OutboxMetrics

    metrics = OutboxMetrics(kit)                    # its own CollectorRegistry
    app.mount("/metrics", metrics.asgi_app())      # behind your own auth if you want

``outboxkit worker --metrics-port 9464`` serves the same metrics from a
dedicated drainer process (``serve_worker_metrics``).  Needs the ``metrics``
extra (``pip install 'outboxkit[metrics]'``); this module is the only place
outboxkit imports ``prometheus_client``, and it does so when an
``OutboxMetrics`` is built, so importing it without the extra is harmless.

Two kinds of figure, with different costs:

* Counters and histograms are fed by the kit's telemetry hooks
  (``outboxkit.telemetry``) as the drain works: attempts by outcome and
  status-code class, delivery latency (``created_at`` to ``done``), send
  duration, drain run duration, database errors, leadership changes, job
  runs and each job's last success, the NOTIFY listener's connection and
  reconnections, dropped attempt-history records.  They count what *this process* did; sum them across processes.
  So do ``outboxkit_hung_sends``, a gauge read from this process's drainers at each scrape
  (``outboxkit.drain.hung_sends``), and ``outboxkit_drain_pool_checked_out`` and ``outboxkit_drain_pool_waiting``,
  read from the drain's own pool (``outboxkit.storage.drain_pool``).
* The row gauges (pending, in flight, stuck, oldest due age, held by order) describe the
  *table*, so every process reports the same values; aggregate them with
  ``max``.  A background thread reads them every ``refresh_seconds`` (15 s by
  default) with the admin's status-count query, which stays on the partial
  indexes (with an ordering key, the oldest due age is that of a row a
  claim could take, never one held behind its key's head:
  ``outboxkit.storage.ordering.ORDERED_BACKLOG``); a scrape never queries the database.  Until the first read
  succeeds they are NaN, never a reassuring 0.  ``outboxkit_outbox_paused``
  and the destination gauges (``outboxkit.metrics.destination_gauges``: state, rows
  waiting and time open per destination, at most
  ``destination_series_limit`` destinations per outbox) are read with them.

Metrics live in a registry the object owns (a fresh ``CollectorRegistry``)
or one you pass (``registry=prometheus_client.REGISTRY`` to opt in to the
process-wide default), so two kits in one process do not collide.  Names and
labels are listed in docs/operations.md; the alert rules in docs/alerts.yml
and the dashboard in docs/grafana-dashboard.json use them.

One module: a metric family after another on one registry, a few lines each, so that
prometheus-client is imported in this one place (the import contract).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import ProgrammingError

from outboxkit.errors import ConfigurationError
from outboxkit.metrics.destination_gauges import DEFAULT_SERIES_LIMIT, DestinationGauges
from outboxkit.metrics.health import HealthServer
from outboxkit.metrics.inbox import InboxMetrics
from outboxkit.storage.operator_queries import admin_queries_for
from outboxkit.storage.pauses import paused_outboxes
from outboxkit.telemetry.hooks import Observer, attempt_class, log_fields

if TYPE_CHECKING:
    from outboxkit.drain.kit_core import KitCore
    from outboxkit.model import Outbox
    from outboxkit.policy import AttemptResult
    from outboxkit.results import DrainResult, RunRecord

__all__ = ["MetricsApp", "MetricsServer", "OutboxMetrics", "serve_worker_metrics"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'outboxkit[metrics]'"
DEFAULT_REFRESH_SECONDS = 15.0
# From a NOTIFY-woken delivery (milliseconds) to the last retries (hours).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
SEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def _prometheus() -> Any:
    """The one place ``prometheus_client`` is imported."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(f"outboxkit.metrics needs prometheus-client: {INSTALL_HINT}") from None
    return prometheus_client


class OutboxMetrics(Observer):
    """The kit's Prometheus metrics, in ``registry``; attaches itself to ``kit.telemetry``.

    ``refresh_seconds`` is how often the row gauges are read from the
    database (by a daemon thread started here; ``refresh()`` reads them now).
    ``close()`` stops the thread and any exporter from ``serve()`` and
    detaches the hooks.  ``destination_series_limit`` bounds the
    per-destination series (``outboxkit.metrics.destination_gauges``).
    """

    def __init__(
        self,
        kit: KitCore,
        *,
        registry: Any = None,
        refresh_seconds: float = DEFAULT_REFRESH_SECONDS,
        destination_series_limit: int = DEFAULT_SERIES_LIMIT,
    ) -> None:
        prometheus = _prometheus()
        if not refresh_seconds > 0:
            raise ConfigurationError(f"refresh_seconds must be positive, got {refresh_seconds!r}")
        limit = destination_series_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 10_000:
            raise ConfigurationError(f"destination_series_limit must be an integer from 0 to 10000, got {limit!r}")
        self.kit = kit
        self.refresh_seconds = float(refresh_seconds)
        self.registry = registry if registry is not None else prometheus.CollectorRegistry()
        self._prometheus = prometheus
        self._define(prometheus)
        self.destination_gauges = DestinationGauges(prometheus, self.registry, series_limit=limit)
        # The inbox's counters, fed by a receiver given ``observers=[metrics.inbox]`` (outboxkit.metrics.inbox).
        self.inbox = InboxMetrics(prometheus, self.registry)
        self._attempts: dict[tuple[str, str, str], Any] = {}  # labelled children, cached off the hot path
        self._per_outbox: dict[str, tuple[Any, Any]] = {}
        self._leading = False
        self._failing: str | None = None
        self._servers: list[MetricsServer] = []
        for outbox in kit.outboxes:
            self._prepare(outbox.__outbox__.job_name)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, name="outboxkit-metrics", daemon=True)
        kit.telemetry.attach(self)
        self._thread.start()

    def _define(self, prometheus: Any) -> None:
        counter, gauge, histogram, registry = prometheus.Counter, prometheus.Gauge, prometheus.Histogram, self.registry
        outbox = ["outbox"]
        self.pending_rows = gauge(
            "outboxkit_pending_rows", "Pending rows: due, in backoff or in flight (table-wide)", outbox, registry=registry
        )
        self.in_flight_rows = gauge(
            "outboxkit_in_flight_rows", "Pending rows a drain holds now, with a live lease (table-wide)", outbox,
            registry=registry,
        )
        self.stuck_rows = gauge("outboxkit_stuck_rows", "Stuck rows waiting for a person (table-wide)", outbox, registry=registry)
        self.discarded_rows = gauge(
            "outboxkit_discarded_rows", "Rows a person discarded: kept, never sent, not stuck (table-wide)", outbox,
            registry=registry,
        )
        self.oldest_due_age = gauge(
            "outboxkit_oldest_due_age_seconds", "How long the oldest due row has been due (0 when none is due)", outbox,
            registry=registry,
        )
        self.held_by_order_rows = gauge(
            "outboxkit_held_by_order_rows",
            "Pending rows waiting behind an earlier row of their ordering key, not due until it is done (table-wide; "
            "0 without an ordering key)",
            outbox, registry=registry,
        )
        self.gauges_refreshed = gauge(
            "outboxkit_row_gauges_refreshed_timestamp_seconds", "When the row gauges were last read (Unix time)",
            registry=registry,
        )
        self.row_refresh_errors = counter(
            "outboxkit_row_refresh_errors", "Failed reads of the row counts behind the row gauges", registry=registry
        )
        self.attempts = counter(
            "outboxkit_attempts",
            "Delivery attempts by outcome (delivered, retried, stuck, lost_claim) and status-code class",
            ["outbox", "outcome", "status_class"],
            registry=registry,
        )
        self.delivery_latency = histogram(
            "outboxkit_delivery_latency_seconds", "From a row's created_at to done", outbox, buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.send_duration = histogram(
            "outboxkit_send_duration_seconds", "One send by the transport, wall time", outbox, buckets=SEND_BUCKETS,
            registry=registry,
        )
        self.drain_run_duration = histogram(
            "outboxkit_drain_run_duration_seconds",
            "A drain call (kind=call: the leader's safety-net drain, the CLI) or a busy spell of a drain loop (kind=loop)",
            ["outbox", "kind"],
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.drain_errors = counter(
            "outboxkit_drain_errors", "Database errors that cut a drain short or lost an outcome write", outbox,
            registry=registry,
        )
        self.leader = gauge("outboxkit_leader", "1 while this process holds the leader lock", registry=registry)
        self.leadership_changes = counter(
            "outboxkit_leadership_changes", "This process became leader (change=elected) or stopped (change=demoted)",
            ["change"], registry=registry,
        )
        self.job_runs = counter(
            "outboxkit_job_runs", "Scheduled job runs by outcome (ok, error, skipped)", ["job", "outcome"],
            registry=registry,
        )
        self.job_run_duration = histogram(
            "outboxkit_job_run_duration_seconds", "One scheduled job run, fence to recorded end", ["job"],
            buckets=RUN_BUCKETS, registry=registry,
        )
        self.outbox_paused = gauge(
            "outboxkit_outbox_paused", "1 while an operator has paused the outbox's drains (table-wide; NaN until read)",
            outbox, registry=registry,
        )
        self.job_last_success = gauge(
            "outboxkit_job_last_success_timestamp_seconds", "When a run of the job last ended ok in this process (Unix time)",
            ["job"], registry=registry,
        )
        self.listener_connected = gauge(
            "outboxkit_listener_connected", "1 while this process's NOTIFY listener holds its connection", registry=registry
        )
        self.listener_reconnects = counter(
            "outboxkit_listener_reconnects", "The NOTIFY listener connected again after losing its connection",
            registry=registry,
        )
        self.attempt_history_dropped = counter(
            "outboxkit_attempt_history_dropped", "Attempt-history records that could not be written (delivery went on)",
            outbox, registry=registry,
        )
        self.hung_sends = gauge(
            "outboxkit_hung_sends",
            "Sends of this process out past their hung threshold (hung_send_seconds): no longer counted against the "
            "outbox's concurrency, each beside a replacement (at most concurrency at once; sum across processes)",
            outbox, registry=registry,
        )
        # The drain's own pool (outboxkit.storage.drain_pool), read at each scrape (no database).
        self.drain_pool_checked_out = gauge(
            "outboxkit_drain_pool_checked_out", "Connections of this process's drain pool in use now", registry=registry
        )
        self.drain_pool_checked_out.set_function(lambda: self.kit.drain_database.checked_out)
        self.drain_pool_waiting = gauge(
            "outboxkit_drain_pool_waiting",
            "Drain threads of this process waiting for a connection of the drain pool now (above 0 for long: raise "
            "OUTBOXKIT_DRAIN_POOL_SIZE)",
            registry=registry,
        )
        self.drain_pool_waiting.set_function(lambda: self.kit.drain_database.waiting)
        for change in ("elected", "demoted"):
            self.leadership_changes.labels(change=change)

    def _prepare(self, job_name: str) -> tuple[Any, Any]:
        """The outbox's latency and send-duration children; every series starts at zero, so rate() works at once."""
        children = self._per_outbox.get(job_name)
        if children is None:
            children = (self.delivery_latency.labels(outbox=job_name), self.send_duration.labels(outbox=job_name))
            self._per_outbox[job_name] = children
            row_gauges = (
                self.pending_rows, self.in_flight_rows, self.stuck_rows, self.discarded_rows, self.oldest_due_age,
                self.held_by_order_rows,
            )
            for gauge in (*row_gauges, self.outbox_paused):
                # NaN until the first successful read: a 0 would say "healthy" about a table nobody has read
                # (the database down at start), and comparisons with NaN never fire an alert either way.
                gauge.labels(outbox=job_name).set(math.nan)
            for kind in ("call", "loop"):
                self.drain_run_duration.labels(outbox=job_name, kind=kind)
            self.drain_errors.labels(outbox=job_name)
            self.attempt_history_dropped.labels(outbox=job_name)
            # Read at each scrape from this process's drainer (no database): what hangs now.
            self.hung_sends.labels(outbox=job_name).set_function(lambda: self.kit.hung_sends(job_name))
            self._attempt("delivered", job_name, "2xx")
        return children

    def _attempt(self, outcome: str, job_name: str, klass: str) -> Any:
        key = (job_name, outcome, klass)
        child = self._attempts.get(key)
        if child is None:
            child = self._attempts[key] = self.attempts.labels(outbox=job_name, outcome=outcome, status_class=key[2])
        return child

    # -- hooks (outboxkit.telemetry.hooks.Observer) ----------------------------------

    def sent(
        self, job_name: str, row: Outbox, state: Any, attempt: AttemptResult, seconds: float, *, outcome: str = ""
    ) -> None:
        self._prepare(job_name)[1].observe(seconds)

    def recorded(self, job_name: str, row: Outbox, attempt: AttemptResult, outcome: str, now: datetime) -> None:
        self._attempt(outcome, job_name, attempt_class(attempt)).inc()
        if outcome == "delivered" and row.created_at is not None:
            latency = (now - row.created_at).total_seconds()
            self._prepare(job_name)[0].observe(max(0.0, latency))

    def parked(self, job_name: str, rows: Sequence[Outbox]) -> None:
        # The attempt that never recorded an outcome (its worker died) ends here, as stuck without an answer.
        self._attempt("stuck", job_name, "none").inc(len(rows))

    def drain_finished(self, job_name: str, result: DrainResult, *, kind: str, seconds: float) -> None:
        self.drain_run_duration.labels(outbox=job_name, kind=kind).observe(seconds)
        errors = len(result.errors) + (1 if result.error else 0)
        if errors:
            self.drain_errors.labels(outbox=job_name).inc(errors)

    def leadership(self, identity: str, state: str) -> None:
        leading = state == "leader"
        if leading != self._leading:
            self._leading = leading
            self.leadership_changes.labels(change="elected" if leading else "demoted").inc()
        self.leader.set(1 if leading else 0)

    def job_finished(self, job_id: str, job_name: str, record: RunRecord, seconds: float) -> None:
        self.job_runs.labels(job=job_id, outcome=record.outcome).inc()
        self.job_run_duration.labels(job=job_id).observe(seconds)
        if record.outcome == "ok":
            self.job_last_success.labels(job=job_id).set(time.time())

    def listener_changed(self, *, connected: bool, reconnected: bool) -> None:
        self.listener_connected.set(1 if connected else 0)
        if reconnected:
            self.listener_reconnects.inc()

    def attempts_dropped(self, job_name: str, records: int) -> None:
        self.attempt_history_dropped.labels(outbox=job_name).inc(records)

    # -- the row gauges --------------------------------------------------------

    def refresh(self) -> None:
        """Read the row gauges of every outbox now (one connection, one status-count query per outbox)."""
        now = self.kit.clock.now()
        with self.kit.engine.connect() as connection:
            for outbox in self.kit.outboxes:
                job_name = outbox.__outbox__.job_name
                counts = admin_queries_for(outbox).status_counts(connection, now=now)
                self.pending_rows.labels(outbox=job_name).set(counts.pending)
                self.in_flight_rows.labels(outbox=job_name).set(counts.in_flight)
                self.stuck_rows.labels(outbox=job_name).set(counts.stuck)
                self.discarded_rows.labels(outbox=job_name).set(counts.discarded)
                age = (now - counts.oldest_due_at).total_seconds() if counts.oldest_due_at is not None else 0.0
                self.oldest_due_age.labels(outbox=job_name).set(max(0.0, age))
                self.held_by_order_rows.labels(outbox=job_name).set(counts.held_by_order or 0)
        self.gauges_refreshed.set(time.time())
        self._refresh_pauses()
        self._refresh_destinations(now)

    def _refresh_pauses(self) -> None:
        """``outboxkit_outbox_paused`` per outbox; left NaN while the pauses table is missing (migration outboxkit_0003)."""
        try:
            with self.kit.engine.connect() as connection:
                paused = paused_outboxes(connection)
        except ProgrammingError:
            return  # the table is missing: the drains log it (pause.table_missing); the rows gauges still count
        for outbox in self.kit.outboxes:
            job_name = outbox.__outbox__.job_name
            self.outbox_paused.labels(outbox=job_name).set(1 if job_name in paused else 0)

    def _refresh_destinations(self, now: datetime) -> None:
        """The destination gauges; left unset while the destinations table is missing (migration outboxkit_0005)."""
        try:
            with self.kit.engine.connect() as connection:
                self.destination_gauges.refresh(connection, self.kit.outboxes, now=now)
        except ProgrammingError:
            return  # the drains need the table too, and say so; the row gauges still count

    def _refresh_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the database is away: keep the last values; the timestamp shows their age
                self.row_refresh_errors.inc()
                message = f"{type(exc).__name__}: {exc}"
                if message != self._failing:
                    self._failing = message
                    logger.warning("could not read the row gauges: %s", message,
                                   extra=log_fields("metrics.refresh_failed"))
            else:
                self._failing = None
            self._stopping.wait(self.refresh_seconds)

    # -- exposing them -----------------------------------------------------------

    def render(self) -> bytes:
        """The registry in the Prometheus text format, as a scrape would see it."""
        return bytes(self._prometheus.generate_latest(self.registry))

    def asgi_app(self) -> Any:
        """An ASGI app that serves the registry: ``app.add_route("/metrics", metrics.asgi_app())``.

        Added as a route it answers at ``/metrics`` itself; mounted
        (``app.mount("/metrics", ...)``) Starlette redirects ``/metrics`` to
        ``/metrics/`` first, which some scrapers do not follow.  It reads only
        the registry (the row gauges come from the background thread), so a
        scrape never waits on the database.
        """
        return MetricsApp(self._prometheus.make_asgi_app(registry=self.registry))

    def serve(
        self, port: int, *, host: str = "127.0.0.1", readiness: Callable[[], str | None] | None = None
    ) -> MetricsServer:
        """A standalone exporter on ``host:port`` in a daemon thread (``port=0`` picks a free one).

        It answers ``/metrics``, ``/healthz`` (200 while the process answers)
        and ``/readyz`` (200, or 503 with the reason ``readiness()`` returns;
        always 200 without one), and 404 on any other path
        (``outboxkit.metrics.health``).
        """
        exporter = MetricsServer(HealthServer(port=port, host=host, readiness=readiness, metrics=self.render))
        self._servers.append(exporter)
        logger.info("serving metrics on http://%s:%d/metrics (and /healthz, /readyz)", host, exporter.port,
                    extra=log_fields("metrics.serving", host=host, port=exporter.port))
        return exporter

    def close(self) -> None:
        """Detach the hooks, stop the refresh thread and every exporter this object started."""
        self.kit.telemetry.detach(self)
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    def __enter__(self) -> OutboxMetrics:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class MetricsApp:
    """The exporter's ASGI app as an object, so Starlette's ``add_route`` serves it as an app at the exact path.

    (``add_route`` wraps a plain function as a request handler; any other callable it calls as ASGI.)
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


class MetricsServer:
    """A running standalone exporter: ``port`` it listens on; ``close()`` stops it."""

    def __init__(self, server: HealthServer) -> None:
        self._server = server
        self.port: int = server.port

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self._server.close()


@contextlib.contextmanager
def serve_worker_metrics(
    kit: KitCore, *, port: int | None, host: str = "127.0.0.1", readiness: Callable[[], str | None] | None = None
) -> Iterator[OutboxMetrics | None]:
    """For ``outboxkit worker --metrics-port``: serve the kit's metrics on ``host:port`` while the block runs.

    The same port answers ``/healthz`` and ``/readyz`` (``readiness``, the
    worker's ``DrainWorker.readiness``); see ``OutboxMetrics.serve``.

    ``port=None`` does nothing.  An ``OutboxMetrics`` the application already
    attached to the kit is served as it is; otherwise one is made for the
    block and closed after it.
    """
    if port is None:
        yield None
        return
    attached = [observer for observer in kit.telemetry.observers if isinstance(observer, OutboxMetrics)]
    metrics = attached[0] if attached else OutboxMetrics(kit)
    server = metrics.serve(port, host=host, readiness=readiness)
    try:
        yield metrics
    finally:
        server.close()
        if not attached:
            metrics.close()
