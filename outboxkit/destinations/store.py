"""The statements on destination state (``outboxkit_destinations``), shared by every process.

Each function takes a connection and runs in the caller's transaction, so
the drain can change a destination's state in the same short transaction
that records a row's outcome.  The rules are ``outboxkit.breaker``'s
pure functions; this module reads a state under a row lock, applies a rule,
and writes the result, which makes every change atomic across processes:

* ``record`` locks the destination's row (``FOR UPDATE``, creating it on the
  first outcome), so two processes recording failures at once count both,
  and the breaker opens once.  It applies the outcomes of a group in their
  order to the state read once, and writes the result once.
* The claim reads the states of the destinations it walks and decides the
  probe itself (``outboxkit.storage.destination_claim``): nothing here holds
  rows back or gives them back for a state.
* A change that lets a blocked destination's rows go again (the breaker
  closes, a person resumes it or ends its cool-down now) also notifies
  the outbox's channel in the same transaction, which wakes every process's
  drain loop to claim them.
* ``prune_quiet`` deletes states that say nothing an absent one does not
  (healthy, no failure run, no slow-down), untouched for a while: retention
  calls it (``outboxkit.leader.retention``), so the table follows the
  destinations that failed lately, not every one that ever did.

A destination with no row is healthy: a state row deleted by hand costs
nothing but its history.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Table,
    bindparam,
    delete,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from outboxkit.breaker import (
    BreakerOptions,
    DestinationState,
    Reading,
    Status,
    after_outcome,
    disabled,
    resumed,
)
from outboxkit.errors import InvalidValueError
from outboxkit.model import LAST_ERROR_LIMIT, Outbox
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.tables import destinations as destination_table

__all__ = ["DestinationStore", "Observation"]

_FIELDS = tuple(field.name for field in dataclasses.fields(DestinationState))


@dataclass(frozen=True, slots=True)
class Observation:
    """One attempt's outcome as its destination's state sees it."""

    reading: Reading
    row_id: int
    status_code: int | None = None
    error: str | None = None
    claimed_until: datetime | None = None  # the row's claim, which a probe's outcome is matched on


class DestinationStore:
    """The destination statements for one outbox class (its job name keys its rows in the table)."""

    def __init__(self, outbox: type[Outbox]) -> None:
        self.outbox = outbox
        self.job_name = outbox.__outbox__.job_name
        self._rows: Table = outbox.__table__  # type: ignore[attr-defined]
        # Read on every claim that finds rows (with the breaker on): built once, since building
        # the statement each time was most of that read's CPU (docs/performance.md).
        self._states = select(destination_table).where(
            destination_table.c.outbox == self.job_name,
            destination_table.c.destination.in_(bindparam("names", expanding=True)),
        )

    # -- reading -------------------------------------------------------------

    def states(self, connection: Connection, names: Iterable[str]) -> dict[str, DestinationState]:
        """The stored state of each named destination (a destination without a row is healthy and absent)."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        return {row.destination: _state(row) for row in connection.execute(self._states, {"names": wanted})}

    def all_states(self, connection: Connection) -> list[DestinationState]:
        """Every destination of this outbox with a stored state, by name."""
        statement = (
            select(destination_table)
            .where(destination_table.c.outbox == self.job_name)
            .order_by(destination_table.c.destination)
        )
        return [_state(row) for row in connection.execute(statement)]

    # -- the drain's changes -------------------------------------------------

    def record(
        self,
        connection: Connection,
        destination: str,
        observations: Sequence[Observation],
        *,
        now: datetime,
        options: BreakerOptions,
    ) -> tuple[DestinationState, DestinationState]:
        """Apply attempts' outcomes, in their order, to their destination; returns the state before and after."""
        before = self._locked(connection, destination, create=True)
        assert before is not None
        after = before
        for seen in observations:
            after = after_outcome(
                after, seen.reading, now=now, row_id=seen.row_id,
                error=seen.error[:LAST_ERROR_LIMIT] if seen.error else seen.error, status_code=seen.status_code,
                options=options, claimed_until=seen.claimed_until,
            )
        self._write(connection, before, after, now=now)
        return before, after

    def prune_quiet(self, connection: Connection, *, untouched_since: datetime, now: datetime, limit: int) -> int:
        """Delete up to ``limit`` states that say nothing an absent one does not (healthy, no failure run, no
        slow-down still running) and that nothing has changed since ``untouched_since``; returns how many."""
        table = destination_table
        quiet = (
            select(table.c.destination)
            .where(
                table.c.outbox == self.job_name,
                table.c.status == Status.HEALTHY.value,
                table.c.consecutive_failures == 0,
                (table.c.slowed_until.is_(None)) | (table.c.slowed_until <= now),
                table.c.updated_at < untouched_since,
            )
            .limit(limit)
            .with_for_update(skip_locked=True)  # a state being recorded right now is left for the next run
        )
        result = connection.execute(
            delete(table).where(table.c.outbox == self.job_name, table.c.destination.in_(quiet.scalar_subquery()))
        )
        return int(result.rowcount)

    # -- a person's actions ----------------------------------------------------

    def resume(self, connection: Connection, destination: str, *, now: datetime, actor: str) -> DestinationState | None:
        """Healthy again, failure run forgotten, its rows claimable at once.  None if the destination has no state."""
        before = self._locked(connection, destination, create=False)
        if before is None:
            return None
        after = resumed(before, actor=actor)
        self._write(connection, before, after, now=now)
        return after

    def disable(self, connection: Connection, destination: str, *, now: datetime, actor: str) -> DestinationState:
        """Send nothing to it until it is resumed."""
        before = self._locked(connection, destination, create=True)
        assert before is not None
        after = disabled(before, now=now, actor=actor)
        self._write(connection, before, after, now=now)
        return after

    def probe_now(self, connection: Connection, destination: str, *, now: datetime) -> DestinationState | None:
        """End an open breaker's cool-down now: its next claimed row goes as the probe.  None unless it is open."""
        before = self._locked(connection, destination, create=False)
        if before is None or before.status != Status.OPEN.value:
            return None
        after = dataclasses.replace(before, next_probe_at=now)
        self._write(connection, before, after, now=now)
        return after

    # -- plumbing ------------------------------------------------------------

    def _locked(self, connection: Connection, destination: str, *, create: bool, share: bool = False) -> DestinationState | None:
        table = destination_table
        if create:
            connection.execute(
                insert(table).values(outbox=self.job_name, destination=destination).on_conflict_do_nothing()
            )
        statement = select(table).where(table.c.outbox == self.job_name, table.c.destination == destination)
        row = connection.execute(statement.with_for_update(read=share)).one_or_none()
        return _state(row) if row is not None else None

    def _write(self, connection: Connection, before: DestinationState, after: DestinationState, *, now: datetime) -> None:
        if after == before:
            return
        if before.outbox != after.outbox or before.destination != after.destination:
            raise InvalidValueError("a destination's state cannot change its outbox or name")
        changed = {name: getattr(after, name) for name in _FIELDS if getattr(after, name) != getattr(before, name)}
        table = destination_table
        connection.execute(
            update(table)
            .where(table.c.outbox == self.job_name, table.c.destination == after.destination)
            .values(**changed, updated_at=now)
        )
        freed = before.blocked(now) and not after.blocked(now)
        moved = after.next_probe_at != before.next_probe_at
        probe_sooner = moved and after.next_probe_at is not None and after.next_probe_at <= now
        if freed or probe_sooner:
            connection.execute(notify_statement(self.outbox))  # on commit: every drain loop claims at once


def _state(row: Row[Any]) -> DestinationState:
    values = row._mapping
    return DestinationState(**{name: values[name] for name in _FIELDS})
