"""The end state of a fault scenario, read from the database and the receiver's log.

A ``Ledger`` joins three records: the outbox rows as they ended, every
committed change to them (``fault_row_history``, written by a trigger) and the
receiver's arrivals.  Its checks are the promises the suite proves:

* nothing is lost: every row ends ``done`` or ``stuck``, and every ``done``
  row's key reached the receiver;
* every request the receiver saw carries the key of a row, so each duplicate
  repeats a key;
* ``attempts`` never decrease from one committed transaction to the next;
* no request goes out without its attempt counted first (arrivals of a key
  <= its attempts);
* no claim starts, and no request arrives, before the due time the previous
  outcome wrote;
* no row is claimed while an earlier claim's lease on it still runs, so
  every duplicate comes from a lease that ran out;
* (scenarios that break sessions wholesale) no ``done`` row ever goes back
  to ``pending``.
"""

from __future__ import annotations

import collections
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, select

from tests.faults.arrivals import Arrival
from tests.faults.models import FAULT_OPTIONS, FaultEvent, row_history

__all__ = ["CLOCK_GRANULARITY", "HistoryEntry", "Ledger", "RowState"]

# Due times are written from the workers' clock and arrivals read from the
# database's; both are this host's clock at microsecond resolution, so a
# millisecond is ample for rounding.
CLOCK_GRANULARITY = timedelta(milliseconds=1)


@dataclass(frozen=True)
class RowState:
    id: int
    key: str
    status: str
    attempts: int
    behaviour: str
    last_status_code: int | None
    last_error: str | None
    claim_token: uuid.UUID | None


@dataclass(frozen=True)
class HistoryEntry:
    row_id: int
    transaction_id: int
    transaction_started_at: datetime
    written_at: datetime
    application_name: str
    kind: str  # claim, outcome, given_back (a claim returned unsent, its attempt taken back) or other
    attempts: int
    status: str
    next_attempt_at: datetime | None
    claim_token: uuid.UUID | None


class Ledger:
    """Rows, their committed history and the receiver's arrivals, with the suite's checks."""

    def __init__(self, rows: list[RowState], history: list[HistoryEntry], arrivals: list[Arrival]) -> None:
        self.rows = rows
        self.history = history
        self.arrivals = arrivals
        self.by_key = {row.key: row for row in rows}
        self.received = collections.Counter(arrival.key for arrival in arrivals)
        self._history_by_row: dict[int, list[HistoryEntry]] = collections.defaultdict(list)
        for entry in history:
            self._history_by_row[entry.row_id].append(entry)

    @classmethod
    def read(cls, engine: Engine, arrivals: list[Arrival]) -> Ledger:
        with engine.connect() as connection:
            table = FaultEvent.__table__
            rows = [
                RowState(
                    id=row.id,
                    key=str(row.idempotency_key),
                    status=row.status,
                    attempts=row.attempts,
                    behaviour=row.behaviour,
                    last_status_code=row.last_status_code,
                    last_error=row.last_error,
                    claim_token=row.claim_token,
                )
                for row in connection.execute(select(table).order_by(table.c.id))
            ]
            history = [
                HistoryEntry(**{name: getattr(entry, name) for name in HistoryEntry.__dataclass_fields__})
                for entry in connection.execute(select(row_history).order_by(row_history.c.seq))
            ]
        return cls(rows, history, arrivals)

    # -- figures -------------------------------------------------------------

    def statuses(self) -> collections.Counter[str]:
        return collections.Counter(row.status for row in self.rows)

    def unfinished(self) -> list[RowState]:
        return [row for row in self.rows if row.status not in ("done", "stuck")]

    def done_never_received(self) -> list[RowState]:
        return [row for row in self.rows if row.status == "done" and self.received[row.key] == 0]

    def lost(self) -> int:
        """Rows neither delivered nor parked, plus rows marked done that the receiver never saw."""
        return len(self.unfinished()) + len(self.done_never_received())

    def duplicates(self) -> int:
        """Requests beyond the first for each key."""
        return sum(count - 1 for count in self.received.values())

    def keys(self, *, status: str | None = None, behaviours: set[str] | None = None) -> set[str]:
        return {
            row.key
            for row in self.rows
            if (status is None or row.status == status) and (behaviours is None or row.behaviour in behaviours)
        }

    # -- invariant checks (each returns the violations) ----------------------

    def unknown_keys(self) -> set[str | None]:
        return set(self.received) - set(self.by_key)

    def attempts_decreases(self) -> list[tuple[int, int, int]]:
        """(row, before, after) where a committed transaction left fewer attempts than the one before."""
        decreases = []
        for row_id, entries in self._history_by_row.items():
            committed: dict[int, HistoryEntry] = {}
            for entry in entries:  # in write order; one row's writers are serialised by its lock
                committed[entry.transaction_id] = entry  # the transaction's last write is what it committed
            values = list(committed.values())
            decreases += [
                (row_id, a.attempts, b.attempts)
                for a, b in zip(values, values[1:], strict=False)
                # A row held back for its destination gives its claim's attempt back: one, unsent.
                if b.attempts < a.attempts and not (b.kind == "given_back" and a.kind == "claim" and b.attempts == a.attempts - 1)
            ]
        return decreases

    def sends_beyond_attempts(self) -> list[tuple[str, int, int]]:
        """(key, arrivals, attempts) where the receiver saw a key more often than attempts were counted."""
        return [
            (row.key, self.received[row.key], row.attempts)
            for row in self.rows
            if self.received[row.key] > row.attempts
        ]

    def live_claims(self) -> list[RowState]:
        """Rows still held by a claim (a lease that was never settled)."""
        return [row for row in self.rows if row.claim_token is not None]

    def outcomes(self, row_id: int) -> dict[int, HistoryEntry]:
        """The outcome written for each attempt of a row, by attempt number."""
        return {entry.attempts: entry for entry in self._history_by_row[row_id] if entry.kind == "outcome"}

    def claims(self, row_id: int | None = None) -> list[HistoryEntry]:
        entries = self.history if row_id is None else self._history_by_row[row_id]
        return [entry for entry in entries if entry.kind == "claim"]

    def interrupted_claims(self) -> int:
        """Claims that never got an outcome: their worker died or lost its session mid-batch."""
        count = 0
        for entries in self._history_by_row.values():
            open_claim = False
            for entry in entries:
                if entry.kind == "claim":
                    count += open_claim
                    open_claim = True
                elif entry.kind in ("outcome", "given_back"):
                    open_claim = False
            count += open_claim
        return count

    def early_claims(self) -> list[tuple[int, int, datetime, datetime]]:
        """(row, attempt, claim start, due) where a claim began before the previous outcome's due time."""
        early = []
        for row_id in self._history_by_row:
            outcomes = self.outcomes(row_id)
            for claim in self.claims(row_id):
                previous = outcomes.get(claim.attempts - 1)
                if previous is None or previous.next_attempt_at is None or previous.status != "pending":
                    continue
                if claim.transaction_started_at + CLOCK_GRANULARITY < previous.next_attempt_at:
                    early.append((row_id, claim.attempts, claim.transaction_started_at, previous.next_attempt_at))
        return early

    def claims_during_lease(self, lease: timedelta) -> list[tuple[int, int, datetime, datetime]]:
        """(row, attempt, claim began, lease end) where a row was claimed while an earlier claim's lease ran.

        A claim begins at the drain's clock reading, which is its lease end
        (written as ``next_attempt_at``) minus the lease.
        """
        overlapping = []
        for row_id in self._history_by_row:
            claims = self.claims(row_id)
            for previous, claim in zip(claims, claims[1:], strict=False):
                if previous.next_attempt_at is None or claim.next_attempt_at is None:
                    continue
                began = claim.next_attempt_at - lease
                settled = any(
                    entry.kind in ("outcome", "given_back") and previous.written_at <= entry.written_at <= claim.written_at
                    for entry in self._history_by_row[row_id]
                )
                if not settled and began + CLOCK_GRANULARITY < previous.next_attempt_at:
                    overlapping.append((row_id, claim.attempts, began, previous.next_attempt_at))
        return overlapping

    def reopened_done_rows(self) -> list[tuple[int, int]]:
        """(row, attempts) where a committed write put a row back to ``pending`` after one had made it ``done``."""
        reopened = []
        for row_id, entries in self._history_by_row.items():
            done = False
            for entry in entries:
                if done and entry.status == "pending":
                    reopened.append((row_id, entry.attempts))
                    break
                done = done or entry.status == "done"
        return reopened

    def early_arrivals(self) -> list[tuple[str, int, datetime, datetime]]:
        """(key, attempt, arrival, due) where a request arrived before the previous outcome's due time."""
        early = []
        for arrival in self.arrivals:
            row = self.by_key.get(arrival.key or "")
            if row is None or arrival.attempt is None:
                continue
            previous = self.outcomes(row.id).get(arrival.attempt - 1)
            if previous is None or previous.next_attempt_at is None:
                continue
            if arrival.at + CLOCK_GRANULARITY < previous.next_attempt_at:
                early.append((row.key, arrival.attempt, arrival.at, previous.next_attempt_at))
        return early

    def assert_invariants(self, context: str) -> None:
        """The checks every scenario makes; ``context`` (seed, logs) goes into the failure message."""
        assert not self.unfinished(), f"rows neither done nor stuck: {self.unfinished()[:5]} ({context})"
        assert not self.done_never_received(), f"done but never received: {self.done_never_received()[:5]} ({context})"
        assert not self.unknown_keys(), f"requests with keys of no row: {sorted(map(str, self.unknown_keys()))[:5]} ({context})"
        assert not self.attempts_decreases(), f"attempts went down: {self.attempts_decreases()[:5]} ({context})"
        assert not self.sends_beyond_attempts(), f"sent without a counted attempt: {self.sends_beyond_attempts()[:5]} ({context})"
        assert not self.early_claims(), f"claimed before due: {self.early_claims()[:5]} ({context})"
        assert not self.early_arrivals(), f"arrived before due: {self.early_arrivals()[:5]} ({context})"
        overlapping = self.claims_during_lease(timedelta(seconds=FAULT_OPTIONS.lease_seconds))
        assert not overlapping, f"claimed while another lease ran: {overlapping[:5]} ({context})"
