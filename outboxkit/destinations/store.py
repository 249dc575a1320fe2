"""The statements on destination state (``outboxkit_destinations``), shared by every process.

Each function takes a connection and runs in the caller's transaction, so
the drain can change a destination's state in the same short transaction
that records a row's outcome.  The rules are ``outboxkit.breaker``'s
pure functions; this module reads a state under a row lock, applies a rule,
and writes the result, which makes every change atomic across processes:

* ``record`` locks the destination's row (``FOR UPDATE``, creating it on the
  first outcome), so two processes recording failures at once count both,
  and the breaker opens once.
* ``try_probe`` is one conditional ``UPDATE``: of any number of processes
  that find the cool-down over, exactly one turns the breaker ``half_open``
  and sends its row as the probe.
* ``hold`` holds claimed rows back without spending their attempts: it
  reads the state ``FOR SHARE`` (so a transition that would release them
  waits for it, or it sees the transition) and gives the rows the due time
  ``held_until``.
* A transition that ends or moves a hold (the breaker closes, a probe fails,
  a person resumes) moves the rows held at the old ``held_until``, in the
  same transaction: one step of the outbox's due index, so waiting rows flow
  again at once instead of at their old due time.  Rows made due now also
  ``NOTIFY`` the outbox's channel, which wakes every process's drain loop.

A destination with no row is healthy: a state row deleted by hand costs
nothing but its history, and its held rows come due at their ``held_until``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Connection, DateTime, Row, Table, Uuid, bindparam, column, select, update, values
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

__all__ = ["DestinationStore"]

_FIELDS = tuple(field.name for field in dataclasses.fields(DestinationState))

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
        reading: Reading,
        *,
        now: datetime,
        row_id: int,
        error: str | None,
        status_code: int | None,
        options: BreakerOptions,
    ) -> tuple[DestinationState, DestinationState]:
        """Apply one attempt's outcome to its destination; returns the state before and after."""
        before = self._locked(connection, destination, create=True)
        assert before is not None
        error = error[:LAST_ERROR_LIMIT] if error else error
        after = after_outcome(
            before, reading, now=now, row_id=row_id, error=error, status_code=status_code, options=options
        )
        self._write(connection, before, after, now=now)
        return before, after

    def try_probe(self, connection: Connection, destination: str, *, row_id: int, now: datetime, probe_until: datetime) -> bool:
        """Make ``row_id`` the destination's probe if its cool-down is over and nobody else did; True if so.

        The rows held until the probe's lease ends (``probe_until``) are the
        ones a failed probe moves to the next cool-down and a successful one
        releases.
        """
        table = destination_table
        result = connection.execute(
            update(table)
            .where(
                table.c.outbox == self.job_name,
                table.c.destination == destination,
                (
                    (table.c.status == Status.OPEN.value) & (table.c.next_probe_at <= now)
                    | (table.c.status == Status.HALF_OPEN.value) & (table.c.probe_until <= now)
                ),
            )
            .values(
                status=Status.HALF_OPEN.value,
                probe_row_id=row_id,
                probe_until=probe_until,
                held_until=probe_until,
                updated_at=now,
            )
        )
        return bool(result.rowcount == 1)

    def hold(
        self, connection: Connection, destination: str, *, ids: list[int], token: uuid.UUID, now: datetime
    ) -> datetime | None:
        """Hold claimed rows back until the destination lets them go; returns that time, or None to send them now.

        The state is read ``FOR SHARE``: a transition that would release held
        rows either committed before (and the rows are sent) or waits for this
        transaction (and then moves them).
        """
        state = self._locked(connection, destination, create=False, share=True)
        until = state.wait_until(now) if state is not None else None
        if until is not None:
            self.release(connection, ids=ids, token=token, until=until, now=now)
        return until

    def release(self, connection: Connection, *, ids: list[int], token: uuid.UUID, until: datetime, now: datetime) -> int:
        """Give claimed rows back unsent: the attempt the claim counted is taken back, due again at ``until``.

        Guarded by the claim token; returns how many rows were given back.
        """
        rows = self._rows
        result = connection.execute(
            update(rows)
            .where(rows.c.id.in_(ids), rows.c.claim_token == token)
            .values(attempts=rows.c.attempts - 1, next_attempt_at=until, claim_token=None, claimed_until=None, updated_at=now)
        )
        return int(result.rowcount)

    def release_claims(
        self, connection: Connection, rows: Sequence[tuple[int, uuid.UUID, datetime]], *, now: datetime
    ) -> int:
        """``release`` for rows of any number of claims, ``(row id, claim token, due time)`` each; one statement.

        Each row is guarded by its own claim token: one reset or claimed again
        meanwhile is left as it is.  Returns how many rows were given back.
        """
        if not rows:
            return 0
        table = self._rows
        claims = values(
            column("id", BigInteger), column("token", Uuid), column("due", DateTime(timezone=True)), name="released_claims"
        ).data(list(rows))
        result = connection.execute(
            update(table)
            .where(table.c.id == claims.c.id, table.c.claim_token == claims.c.token)
            .values(
                attempts=table.c.attempts - 1, next_attempt_at=claims.c.due, claim_token=None, claimed_until=None, updated_at=now
            )
        )
        return int(result.rowcount)

    # -- a person's actions ----------------------------------------------------

    def resume(self, connection: Connection, destination: str, *, now: datetime, actor: str) -> DestinationState | None:
        """Healthy again, failure run forgotten, held rows due now.  None if the destination has no state."""
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
        after = dataclasses.replace(before, next_probe_at=now, held_until=now)
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
        if before.held_until is not None and before.held_until != after.held_until:
            # The hold ended or moved: its rows follow, due at the new hold's end or now.  Held rows
            # carry exactly held_until, so the due index finds them in one step.
            rows = self._rows
            connection.execute(
                update(rows)
                .where(rows.c.status == "pending", rows.c.next_attempt_at == before.held_until, rows.c.claim_token.is_(None))
                .values(next_attempt_at=after.held_until or now, updated_at=now)
            )
            if after.held_until is None:
                connection.execute(notify_statement(self.outbox))  # on commit: every drain loop claims them at once


def _state(row: Row[Any]) -> DestinationState:
    values = row._mapping
    return DestinationState(**{name: values[name] for name in _FIELDS})
