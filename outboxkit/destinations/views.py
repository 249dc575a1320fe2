"""The operator's statements on destinations: each stored state with the rows waiting for it, and their release.

The admin, the CLI (through ``outboxkit.operations.destinations``) and the
metrics read destinations here.  A destination's state is its row in
``outboxkit_destinations`` (``outboxkit.destinations.store``); one that has
never changed state has no row and is healthy, so it is not listed.

**Rows waiting.**  Rows have no destination column: a row's destination
comes from its delivery, which only ``build_delivery`` knows.  What the
database does know is the rows a destination holds back: a row given back
unsent because its breaker is open, half-open or disabled, or because a
``Retry-After`` slows its destination, carries exactly the hold's end as its
due time (``held_until``, ``next_probe_at`` of the cool-down it waited for,
or ``slowed_until``).  So the rows waiting for a destination are the pending,
unclaimed rows due at one of those instants: one step of the outbox's due
index each, counted up to a cap like the admin's other counts.  A healthy
destination that is not slowed holds nothing back (its rows are simply due,
or in their own backoff) and has no rows waiting.

``release_waiting`` makes the rows held at given instants due now: what a
person's resume or "probe now" does to rows that the state transition
itself does not move (rows held by a ``Retry-After`` slow-down, rows still
at the cool-down's end when a probe took the hold over).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, case, select, text, update

from outboxkit.breaker import DestinationState, Status
from outboxkit.destinations.store import DestinationStore
from outboxkit.model import Outbox
from outboxkit.storage.drain_queries import quote_table
from outboxkit.storage.tables import destinations as destination_table

__all__ = [
    "DestinationView",
    "destination_views",
    "hold_instants",
    "read_state",
    "release_waiting",
    "waiting_counts",
    "waiting_rows",
]

# The order operators read destinations in: the ones that need a person first.
_STATUS_ORDER = {Status.DISABLED.value: 0, Status.OPEN.value: 1, Status.HALF_OPEN.value: 2, Status.HEALTHY.value: 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class DestinationView:
    """One destination's state and the rows it holds back (``waiting_rows``, at most ``cap``; ``at_least`` beyond)."""

    state: DestinationState
    waiting_rows: int
    waiting_rows_at_least: bool


def hold_instants(state: DestinationState, *, now: datetime) -> list[datetime]:
    """The due times the rows this destination holds back carry (see the module docstring), earliest first."""
    instants: set[datetime] = set()
    if state.status != Status.HEALTHY.value and state.held_until is not None:
        instants.add(state.held_until)
    if state.status in (Status.OPEN.value, Status.HALF_OPEN.value) and state.next_probe_at is not None:
        instants.add(state.next_probe_at)  # rows held through the cool-down, before the probe moved the hold
    if state.slowed_until is not None and state.slowed_until > now:
        instants.add(state.slowed_until)
    return sorted(instants)


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
    """Rows held back for each destination in one statement (one capped index step per hold instant).

    A count over ``cap`` means "over cap"; destinations that hold nothing back are absent.
    """
    pairs = [(state.destination, instant) for state in states for instant in hold_instants(state, now=now)]
    if not pairs:
        return {}
    table = quote_table(outbox.__table__)  # type: ignore[attr-defined]
    statement = text(
        "SELECT held.destination, sum(counted.rows) FROM unnest(CAST(:names AS text[]), CAST(:instants AS timestamptz[])) "
        "AS held(destination, instant) CROSS JOIN LATERAL (SELECT count(*) AS rows FROM (SELECT 1 FROM "
        f"{table} WHERE status = 'pending' AND next_attempt_at = held.instant AND claim_token IS NULL LIMIT :cap) AS capped) "
        "AS counted GROUP BY held.destination"
    )
    names, instants = [name for name, _ in pairs], [instant for _, instant in pairs]
    found = connection.execute(statement, {"names": names, "instants": instants, "cap": cap + 1})
    return {name: int(count) for name, count in found}


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


def release_waiting(connection: Connection, outbox: type[Outbox], instants: list[datetime], *, now: datetime) -> int:
    """Rows held at ``instants`` (pending, unclaimed) become due now; returns how many (the caller notifies the drains)."""
    if not instants:
        return 0
    rows = outbox.__table__  # type: ignore[attr-defined]
    result = connection.execute(
        update(rows)
        .where(rows.c.status == "pending", rows.c.next_attempt_at.in_(instants), rows.c.claim_token.is_(None))
        .values(next_attempt_at=now, updated_at=now)
    )
    return int(result.rowcount)
