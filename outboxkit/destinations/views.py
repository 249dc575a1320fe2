"""The operator's statements on destinations: each stored state with the rows waiting for it.

The admin, the CLI (through ``outboxkit.operations.destinations``) and the
metrics read destinations here.  A destination's state is its row in
``outboxkit_destinations`` (``outboxkit.destinations.store``); one that has
never changed state has no row and is healthy, so it is not listed.

**Rows waiting.**  Each row carries its destination, so the rows a blocked
destination (open, half-open, disabled, or slowed by a ``Retry-After``)
keeps from the claim are its pending rows: one capped step of the outbox's
index ``ix_<table>_destination_due`` each.  A destination that is not blocked
keeps nothing back (its rows are simply due, or in their own backoff).
``waiting_until`` is when they may go again: the probe's time, the end of
the slow-down, or never while it is disabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, case, select, text

from outboxkit.breaker import DestinationState, Status
from outboxkit.destinations.store import DestinationStore
from outboxkit.model import Outbox
from outboxkit.storage.drain_queries import quote_table
from outboxkit.storage.tables import destinations as destination_table

__all__ = [
    "DestinationView",
    "destination_views",
    "read_state",
    "waiting_counts",
    "waiting_rows",
    "waiting_until",
]

# The order operators read destinations in: the ones that need a person first.
_STATUS_ORDER = {Status.DISABLED.value: 0, Status.OPEN.value: 1, Status.HALF_OPEN.value: 2, Status.HEALTHY.value: 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class DestinationView:
    """One destination's state and the rows it holds back (``waiting_rows``, at most ``cap``; ``at_least`` beyond)."""

    state: DestinationState
    waiting_rows: int
    waiting_rows_at_least: bool


def waiting_until(state: DestinationState, *, now: datetime) -> datetime | None:
    """When a blocked destination's rows may be claimed again (the probe's time, the slow-down's end); None when it is
    not blocked, or disabled (until a person resumes it)."""
    if not state.blocked(now) or state.status == Status.DISABLED.value:
        return None
    moments = [state.slowed_until if state.slowed_until is not None and state.slowed_until > now else None]
    if state.status == Status.OPEN.value:
        moments.append(state.next_probe_at)
    elif state.status == Status.HALF_OPEN.value:
        moments.append(state.probe_until)
    known = [moment for moment in moments if moment is not None]
    return max(known) if known else None


def read_state(connection: Connection, outbox: type[Outbox], destination: str, *, lock: bool = False) -> DestinationState | None:
    """One destination's stored state (None: it has none); ``lock`` takes its row lock first, as a change of it will."""
    if lock:
        table = destination_table
        connection.execute(
            select(table.c.destination)
            .where(table.c.outbox == outbox.__outbox__.job_name, table.c.destination == destination)
            .with_for_update()
        )
    return DestinationStore(outbox).states(connection, [destination]).get(destination)


def waiting_rows(connection: Connection, outbox: type[Outbox], state: DestinationState, *, now: datetime, cap: int) -> int:
    """Pending rows held back for this destination, counted up to ``cap + 1`` (more than ``cap`` means "over cap")."""
    return waiting_counts(connection, outbox, [state], now=now, cap=cap).get(state.destination, 0)


def waiting_counts(
    connection: Connection, outbox: type[Outbox], states: list[DestinationState], *, now: datetime, cap: int
) -> dict[str, int]:
    """Pending rows each blocked destination keeps from the claim, in one statement (one capped index step each).

    A count over ``cap`` means "over cap"; destinations that are not blocked are absent.
    """
    names = [state.destination for state in states if state.blocked(now)]
    if not names:
        return {}
    table = quote_table(outbox.__table__)  # type: ignore[attr-defined]
    statement = text(
        "SELECT held.destination, counted.rows FROM unnest(CAST(:names AS text[])) AS held(destination) "
        "CROSS JOIN LATERAL (SELECT count(*) AS rows FROM (SELECT 1 FROM "
        f"{table} WHERE status = 'pending' AND destination = held.destination LIMIT :cap) AS capped) AS counted"
    )
    found = connection.execute(statement, {"names": names, "cap": cap + 1})
    return {name: int(count) for name, count in found if count}


def destination_views(
    connection: Connection, outbox: type[Outbox], *, now: datetime, cap: int, limit: int | None = None
) -> list[DestinationView]:
    """The outbox's stored destinations, those that need a person first (disabled, open, half-open, healthy), then by name.

    ``limit`` keeps the first ``limit`` of that order (the metrics' bound on
    label cardinality); rows waiting are counted for each one kept, in one statement.
    """
    table = destination_table
    statement = (
        select(table.c.destination)
        .where(table.c.outbox == outbox.__outbox__.job_name)
        .order_by(case(_STATUS_ORDER, value=table.c.status, else_=4), table.c.destination)
    )
    if limit is not None:
        statement = statement.limit(limit)
    names = list(connection.scalars(statement))
    states = DestinationStore(outbox).states(connection, names)
    kept = [states[name] for name in names if name in states]  # a row deleted by hand meanwhile: healthy, not shown
    counts = waiting_counts(connection, outbox, kept, now=now, cap=cap)
    return [
        DestinationView(
            state=state,
            waiting_rows=min(counts.get(state.destination, 0), cap),
            waiting_rows_at_least=counts.get(state.destination, 0) > cap,
        )
        for state in kept
    ]
