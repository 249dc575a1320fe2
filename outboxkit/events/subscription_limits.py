"""A subscription's own limits (``rate_limit``, ``max_in_flight``): its destination's row of operator limits.

There is no second copy: the limits of subscription 12 are the row of
``outboxkit_destination_limits`` for its destination on the deliveries outbox
(``outboxkit.destinations.limits``), which every claim reads and whose change
wakes the drains.  ``SubscriptionStore`` (``outboxkit.events.store``) calls
these in the subscription's own transaction: it reads a subscription with its
limits beside it, locks them before a change, and moves them when an edit
moves the subscription's destination.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, Select, and_, select

from outboxkit.destinations.limits import DestinationLimits, read_limits, write_limits
from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.deliveries import EventDelivery
from outboxkit.storage.tables import destination_limits, subscriptions

__all__ = ["limits_asked", "limits_in_row", "locked_limits", "move_limits", "with_limits"]


def with_limits() -> Select[Any]:
    """Subscription rows with their destination's limits beside them (``per_second``, ``cap``; NULL without)."""
    operator = destination_limits
    joined = subscriptions.outerjoin(operator, and_(
        operator.c.outbox == EventDelivery.__outbox__.job_name, operator.c.destination == subscriptions.c.destination,
    ))
    return select(subscriptions, operator.c.per_second, operator.c.cap).select_from(joined)


def limits_in_row(row: RowMapping) -> DestinationLimits:
    """The limits of a row read with ``with_limits``."""
    return DestinationLimits(per_second=row["per_second"], cap=row["cap"])


def limits_asked(definition: SubscriptionDefinition) -> DestinationLimits:
    """The limits a definition asks for (None: the deliveries outbox's own)."""
    return DestinationLimits(per_second=definition.rate_limit, cap=definition.max_in_flight)


def locked_limits(connection: Connection, row: RowMapping) -> DestinationLimits:
    """The limits of the subscription's destination, locked until the transaction ends (none without one)."""
    if row["destination"] is None:
        return DestinationLimits()
    return read_limits(connection, EventDelivery, row["destination"], lock=True)


def move_limits(
    connection: Connection,
    old: str | None,
    before: DestinationLimits,
    new: str | None,
    after: DestinationLimits,
    *,
    now: datetime,
    actor: str,
) -> None:
    """The limits ``after`` on destination ``new`` (None: the subscription is gone) and none left on ``old``
    (``before``: what it holds); limits already so are not written again (nor the drains woken)."""
    if old is not None and old != new and not before.empty:
        write_limits(connection, EventDelivery, old, DestinationLimits(), now=now, actor=actor)
    if new is not None and (old != new or (before.per_second, before.cap) != (after.per_second, after.cap)):
        write_limits(connection, EventDelivery, new, after, now=now, actor=actor)
