"""Limits an operator sets on one destination while the kit runs: a rate limit and a cap on sends in flight.

One row of ``outboxkit_destination_limits`` per (outbox, destination) with an
operator's limits.  Each replaces, for its destination only, what the outbox
says in code and settings:

* ``per_second``: its requests per second (``outboxkit.rate_limits``), in its
  token bucket's refill, across every process;
* ``cap``: the most of its rows claimed at once across every process, at all
  times (the outbox's own ``destination_cap`` applies only while a
  destination is suspect and others have due rows).

An event subscription's own limits (``rate_limit``, ``max_in_flight``) are
this row for its destination on the deliveries outbox:
``outboxkit.events.store`` writes, moves and deletes it with the
subscription, so an operator's change here is the subscription's too.

A destination without a row, or a limit left NULL, keeps the outbox's own:
clearing a limit is deleting it.  Nothing is cached: every claim reads the row
by key in its own statement (``outboxkit.storage.destination_claim``), and a
change notifies the outbox's channel in its transaction, so every process's
drain loop claims under the new limits as soon as it commits (a lost
notification: at the loop's next claim, the safety-net drain at the latest).
An outbox without a rate limit of its own claims without tokens until a
drainer learns a destination has an operator's rate; until then it takes none
of that destination's rows (``OutboxQueries.claim_due_rows`` says when it
learns).

The statements run in the caller's transaction; ``check_limits`` is the rule
for the values, the same for the admin, the JSON API and the CLI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, exists, select
from sqlalchemy.dialects.postgresql import insert

from outboxkit.errors import InvalidValueError
from outboxkit.model import Outbox
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.tables import destination_limits, destination_rates, destinations

__all__ = [
    "MAX_CAP",
    "MAX_PER_SECOND",
    "DestinationLimits",
    "check_limits",
    "is_known",
    "limit_from_text",
    "read_limits",
    "write_limits",
]

# The largest values accepted: beyond them a limit limits nothing a drainer could reach.
MAX_PER_SECOND = 1_000_000.0
MAX_CAP = 10_000


@dataclass(frozen=True, slots=True)
class DestinationLimits:
    """An operator's limits of one destination (None: the outbox's own)."""

    per_second: float | None = None
    cap: int | None = None
    updated_by: str | None = None
    updated_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.per_second is None and self.cap is None


def check_limits(per_second: object, cap: object) -> tuple[float | None, int | None]:
    """The values as stored, or ``InvalidValueError`` naming the first bad one (None: the outbox's own)."""
    rate: float | None = None
    if per_second is not None:
        if isinstance(per_second, bool) or not isinstance(per_second, (int, float)) or not math.isfinite(per_second):
            raise InvalidValueError(f"rate limit must be a number of requests per second, got {per_second!r}")
        if not 0 < per_second <= MAX_PER_SECOND:
            raise InvalidValueError(
                f"rate limit must be more than 0 and at most {MAX_PER_SECOND:,.0f} requests per second, got {per_second!r}"
                " (to lift the override, clear it)"
            )
        rate = float(per_second)
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, int):
            raise InvalidValueError(f"cap must be a whole number of sends in flight, got {cap!r}")
        if not 1 <= cap <= MAX_CAP:
            raise InvalidValueError(
                f"cap must be from 1 to {MAX_CAP:,} sends in flight, got {cap!r} (to lift the override, clear it)"
            )
    return rate, cap


def limit_from_text(raw: str | None, what: str, *, whole: bool) -> float | int | None:
    """A limit typed by a person (a form field, a command's option): None when blank or ``default`` (the outbox's
    own), else the number; text that is not one is refused (``check_limits`` then decides its range)."""
    text = (raw or "").strip()
    if not text or text.lower() == "default":
        return None
    try:
        return int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise InvalidValueError(
            f"{what} must be {kind}, or blank or 'default' for the outbox's own, got {text[:40]!r}; nothing was changed"
        ) from None


def read_limits(connection: Connection, outbox: type[Outbox], destination: str, *, lock: bool = False) -> DestinationLimits:
    """The operator's limits of ``destination`` (empty without any); ``lock`` holds its row for a change."""
    table = destination_limits
    statement = select(table).where(table.c.outbox == outbox.__outbox__.job_name, table.c.destination == destination)
    row = connection.execute(statement.with_for_update() if lock else statement).one_or_none()
    if row is None:
        return DestinationLimits()
    return DestinationLimits(per_second=row.per_second, cap=row.cap, updated_by=row.updated_by, updated_at=row.updated_at)


def write_limits(
    connection: Connection, outbox: type[Outbox], destination: str, limits: DestinationLimits, *, now: datetime, actor: str
) -> None:
    """Store ``limits`` as the destination's (empty: delete its row), and wake every drain loop on commit."""
    table = destination_limits
    job_name = outbox.__outbox__.job_name
    if limits.empty:
        connection.execute(delete(table).where(table.c.outbox == job_name, table.c.destination == destination))
    else:
        values = {"per_second": limits.per_second, "cap": limits.cap, "updated_by": actor[:200], "updated_at": now}
        connection.execute(
            insert(table)
            .values(outbox=job_name, destination=destination, **values)
            .on_conflict_do_update(index_elements=[table.c.outbox, table.c.destination], set_=values)
        )
    connection.execute(notify_statement(outbox))  # on commit: every drain loop claims under the new limits


def is_known(connection: Connection, outbox: type[Outbox], destination: str) -> bool:
    """Whether the outbox knows ``destination``: a stored state, a rate bucket, an operator's limits, a pending row,
    or a name in its own rate limit.  Each is one read by key (the pending row on ``ix_<table>_destination_due``)."""
    options = outbox.__outbox__
    if options.rate_limit is not None and destination in options.rate_limit.destinations:
        return True
    job_name = options.job_name
    stored = [
        exists().where(table.c.outbox == job_name, table.c.destination == destination)
        for table in (destinations, destination_rates, destination_limits)
    ]
    rows = outbox.__table__  # type: ignore[attr-defined]
    pending = exists().where(rows.c.status == "pending", rows.c.destination == destination)
    return bool(connection.execute(select(stored[0] | stored[1] | stored[2] | pending)).scalar_one())


