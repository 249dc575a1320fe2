"""The destination gauges of ``outboxkit.metrics``: each destination's state, rows waiting and time open.

``OutboxMetrics`` builds one ``DestinationGauges`` with the ``prometheus_client``
module it imported (so this module never imports it) and refreshes it beside
the row gauges, from the database, every ``refresh_seconds``.  Like the row
gauges they describe the shared table, so every process reports the same
values (aggregate with ``max``)::

    outboxkit_destinations{outbox, state}                     destinations in each state (all of them)
    outboxkit_destination_state{outbox, destination, state}   1 for the destination's state, 0 for the other three
    outboxkit_destination_waiting_rows{outbox, destination}   rows it holds back (counted up to 10,000)
    outboxkit_destination_open_seconds{outbox, destination}   how long it has been open or half-open (0 otherwise)

**Label cardinality is bounded.**  A destination name may be per tenant or
per partner, so there may be many.  The per-destination series cover at
most ``series_limit`` destinations per outbox (50 by default): those that
need a person first (disabled, open, half-open), then healthy ones by name;
a destination that leaves that set (healthy again behind 50 others, its
state row deleted) has its series removed, not left at a stale value.  The
``outboxkit_destinations`` counts always cover every destination, so a set
cut short shows as counts larger than the series.  At most
``outboxes x series_limit x 6`` destination series exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from outboxkit.breaker import STATUSES, Status
from outboxkit.destinations.views import destination_views
from outboxkit.model import Outbox
from outboxkit.storage.tables import destinations as destination_table

__all__ = ["DEFAULT_SERIES_LIMIT", "DestinationGauges"]

DEFAULT_SERIES_LIMIT = 50
WAITING_COUNT_CAP = 10_000  # as the admin counts rows waiting
_OPEN = (Status.OPEN.value, Status.HALF_OPEN.value)


class DestinationGauges:
    """The destination gauges in ``registry``, made with the ``prometheus`` module ``outboxkit.metrics`` imported."""

    def __init__(self, prometheus: Any, registry: Any, *, series_limit: int = DEFAULT_SERIES_LIMIT) -> None:
        gauge = prometheus.Gauge
        self.series_limit = series_limit
        self.counts = gauge(
            "outboxkit_destinations", "Destinations with a stored state, by state (table-wide; every destination)",
            ["outbox", "state"], registry=registry,
        )
        self.state = gauge(
            "outboxkit_destination_state",
            "1 for the destination's circuit-breaker state, 0 for the others (table-wide; at most series_limit per outbox)",
            ["outbox", "destination", "state"], registry=registry,
        )
        self.waiting_rows = gauge(
            "outboxkit_destination_waiting_rows", "Pending rows the destination holds back, counted up to 10,000 (table-wide)",
            ["outbox", "destination"], registry=registry,
        )
        self.open_seconds = gauge(
            "outboxkit_destination_open_seconds",
            "How long the destination has been open or half-open, kept through failed probes (0 when not; table-wide)",
            ["outbox", "destination"], registry=registry,
        )
        self._shown: dict[str, set[str]] = {}  # per outbox, the destinations that have series now

    def refresh(self, connection: Connection, outboxes: Sequence[type[Outbox]], *, now: datetime) -> None:
        """Read every outbox's destinations and set the gauges (one count query, one list and one count per shown)."""
        table = destination_table
        counted = connection.execute(
            select(table.c.outbox, table.c.status, func.count()).group_by(table.c.outbox, table.c.status)
        ).all()
        counts = {(outbox, status): int(count) for outbox, status, count in counted}
        for outbox in outboxes:
            job_name = outbox.__outbox__.job_name
            for status in STATUSES:
                self.counts.labels(outbox=job_name, state=status).set(counts.get((job_name, status), 0))
            views = destination_views(connection, outbox, now=now, cap=WAITING_COUNT_CAP, limit=self.series_limit)
            shown = set()
            for view in views:
                state, name = view.state, view.state.destination
                shown.add(name)
                for status in STATUSES:
                    self.state.labels(outbox=job_name, destination=name, state=status).set(1 if state.status == status else 0)
                self.waiting_rows.labels(outbox=job_name, destination=name).set(view.waiting_rows)
                opened = state.opened_at if state.status in _OPEN else None
                self.open_seconds.labels(outbox=job_name, destination=name).set(
                    max(0.0, (now - opened).total_seconds()) if opened is not None else 0.0
                )
            for gone in self._shown.get(job_name, set()) - shown:
                self._remove(job_name, gone)
            self._shown[job_name] = shown

    def _remove(self, job_name: str, destination: str) -> None:
        for status in STATUSES:
            self.state.remove(job_name, destination, status)
        self.waiting_rows.remove(job_name, destination)
        self.open_seconds.remove(job_name, destination)
