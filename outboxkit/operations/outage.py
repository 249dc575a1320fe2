"""What destinations hold back during an outage: the overview's and ``outboxkit status``'s view of it.

A destination that is open, half-open, disabled or slowed by a ``Retry-After`` keeps its pending rows
from the claim (``outboxkit.destinations.views``): those rows are pending but never due while it holds
them, so neither the pending count nor the oldest due row nor the backlog of due rows shows them as
such.  Here each outbox's blocked destinations become ``HeldByDestination`` entries, with the rows
each holds, ordered as an operator reads them: disabled first (only a person ends it), then open,
half-open and slowed; within each, the most rows first.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import Connection

from outboxkit.model import Outbox
from outboxkit.operations.destinations import DestinationModel, DestinationOperations
from outboxkit.operations.schemas import HeldByDestination

__all__ = ["held_back", "ordered"]

HeldState = Literal["disabled", "open", "half_open", "slowed"]
_STATE_ORDER = {"disabled": 0, "open": 1, "half_open": 2, "slowed": 3}


def held_back(destinations: DestinationOperations, connection: Connection, outbox: type[Outbox]) -> list[HeldByDestination]:
    """The outbox's destinations that hold rows back now, in the order operators read them."""
    listed = destinations.listed(connection, outbox)
    return ordered([entry for destination in listed if (entry := _held(destination)) is not None])


def ordered(entries: list[HeldByDestination]) -> list[HeldByDestination]:
    return sorted(entries, key=lambda entry: (_STATE_ORDER[entry.state], -entry.waiting_rows, entry.outbox, entry.destination))


def _held(destination: DestinationModel) -> HeldByDestination | None:
    state: HeldState
    if destination.status != "healthy":
        state = destination.status
    elif destination.slowed_until is not None:
        state = "slowed"
    else:
        return None
    return HeldByDestination(
        outbox=destination.outbox,
        destination=destination.name,
        state=state,
        waiting_rows=destination.waiting_rows,
        waiting_rows_at_least=destination.waiting_rows_at_least,
        since=destination.open_since,
        until=destination.waiting_until or destination.slowed_until,
        last_error=destination.last_error,
        last_status_code=destination.last_status_code,
    )
