"""Rows over their destination's cap that wait in the drainer, still claimed, for a place under it.

A suspect destination (one that has not answered yet, is failing, or is
slow) has at most ``OutboxOptions.destination_cap`` sends in flight from one
drainer (``outboxkit.destinations.gate``).  Up to ``limit`` of the rows of a
claim beyond that cap wait here, with their claim, their counted attempt and
their built delivery, rather than going back to the table to be claimed
again: when a send to their
destination ends (a place under its cap is free) they go through the gate
again, and the first of them are sent; nothing is written for them meanwhile.
This module is the bookkeeping; ``outboxkit.drain.cap_waiting`` moves the rows
(in, to the send pool, back to the table) for the pump.

A row waits only while its lease leaves room for a whole send: from
``send_by`` (its lease's end, less the time to record an outcome and one
``timeout``) it is given back unsent, its attempt taken back, as a row over
the cap always was.  Rows beyond ``limit`` are given back at once.  When the
pump returns (a drain call ends, the loop stops), every row still waiting is
given back.  A drainer that dies meanwhile leaves them claimed: they come due
at their lease's end with that unsent attempt counted, as rows queued for a
send thread always have.

Each pump state has its own backlog, and only the pump's thread that claimed
its rows touches it (through ``outboxkit.drain.cap_waiting``): no lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from outboxkit.model import Outbox
from outboxkit.transports.base import Delivery

__all__ = ["CapBacklog", "Waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A claimed row over its destination's cap: its built delivery, its claim, and when it must go back unsent."""

    row: Outbox
    delivery: Delivery
    destination: str
    token: uuid.UUID
    send_by: datetime


class CapBacklog:
    """One pump's rows waiting for a place under their destination's cap, oldest claim first (see the module)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._by_destination: dict[str, list[Waiting]] = {}
        self._count = 0
        self._earliest: datetime | None = None  # the earliest send_by waiting

    def __len__(self) -> int:
        return self._count

    @property
    def room(self) -> int:
        """How many more rows may wait."""
        return max(0, self.limit - self._count)

    def destinations(self) -> set[str]:
        """The destinations with rows waiting."""
        return set(self._by_destination)

    def add(self, entries: list[Waiting]) -> None:
        """Rows over their cap, to wait after those already waiting (the caller keeps within ``room``)."""
        for entry in entries:
            self._by_destination.setdefault(entry.destination, []).append(entry)
            if self._earliest is None or entry.send_by < self._earliest:
                self._earliest = entry.send_by
        self._count += len(entries)

    def take(self, destinations: Collection[str] | None = None) -> list[Waiting]:
        """Remove and return the rows waiting for ``destinations`` (every row when None), oldest first per destination."""
        names = list(self._by_destination) if destinations is None else [
            name for name in self._by_destination if name in destinations
        ]
        taken: list[Waiting] = []
        for name in names:
            taken.extend(self._by_destination.pop(name))
        self._removed(len(taken))
        return taken

    def expired(self, now: datetime) -> list[Waiting]:
        """Remove and return the rows whose lease no longer leaves room for a send (``send_by`` reached)."""
        if self._earliest is None or self._earliest > now:
            return []
        gone: list[Waiting] = []
        for name in list(self._by_destination):
            entries = self._by_destination[name]
            keep = [entry for entry in entries if entry.send_by > now]
            if len(keep) == len(entries):
                continue
            gone.extend(entry for entry in entries if entry.send_by <= now)
            if keep:
                self._by_destination[name] = keep
            else:
                del self._by_destination[name]
        self._removed(len(gone))
        return gone

    @property
    def next_expiry(self) -> datetime | None:
        """The earliest ``send_by`` of the rows waiting, None when none is."""
        return self._earliest

    def _removed(self, count: int) -> None:
        self._count -= count
        self._earliest = min(
            (entry.send_by for entries in self._by_destination.values() for entry in entries), default=None
        )
