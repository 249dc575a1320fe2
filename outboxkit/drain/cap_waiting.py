"""The hand-off of rows waiting over their destination's cap: kept, sent when a place frees, given back.

The gate (``outboxkit.destinations.gate``) puts the rows of a claim beyond a
suspect destination's cap in ``Admission.waiting``; the pump
(``outboxkit.drain.pump``) keeps them, claimed, in its state's
``CapBacklog`` (``outboxkit.drain.cap_backlog``, the bookkeeping) and moves them
only through ``CapWaiting``:

* ``admitted``: the rows the gate cleared go to the send pool (the pump's
  ``submit``, their in-flight places already taken); those it kept over a cap
  wait, each until its ``send_by``: its lease's end, less the time to record
  an outcome and one whole send (``timeout``).
* ``send_ready``: when a send is back (a place under a cap may be free), the
  rows waiting for a destination with room go through the gate again
  (``DestinationGate.readmit``), as many as this drainer's in-flight bound
  has places for: the first are sent, a destination found open holds them,
  the rest wait on.
* ``expire``: rows whose ``send_by`` has come go back unsent.
* ``give_back``: when the pump returns (a drain call ends or reaches its
  limit, the loop stops), every row still waiting goes back unsent.

A row goes back with its attempt taken back, under its claim token
(``DestinationGate.give_back_over_cap``).  Only the pump's thread moves a
backlog's rows.

``count`` is how many rows wait now in all of this pump's backlogs (a drain
call's and the background loop's): the metrics' gauge
``outboxkit_waiting_over_cap_rows`` reads it from another thread, so it is
kept under a lock, changed with every row that enters or leaves a backlog.
A drain call that gave up on a database error leaves its rows claimed (they
come back at their lease's end): ``forget`` stops counting them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from outboxkit.clock import Clock
from outboxkit.destinations.gate import Admission, DestinationGate, Send
from outboxkit.drain.cap_backlog import CapBacklog, Waiting
from outboxkit.drain.send_pool import InFlightLimit
from outboxkit.model import Outbox

__all__ = ["WAITING_BATCHES", "CapWaiting", "Submit"]

# Rows over their destination's cap that wait in one pump state: at most this many batches.
WAITING_BATCHES = 2

# Hands a cleared row of one claim to the send pool; the pump counts it in flight.
Submit = Callable[[Send, uuid.UUID], None]


class CapWaiting:
    """The hand-off of one pump's rows waiting over a cap (see the module); each state has its own ``backlog()``.

    ``record_margin`` and ``timeout`` set how long a row may wait: until its
    lease's end less both (``send_by``).
    """

    def __init__(
        self,
        gate: DestinationGate,
        in_flight: InFlightLimit,
        *,
        clock: Clock,
        batch_size: int,
        timeout: float,
        record_margin: float,
    ) -> None:
        self.gate = gate
        self.in_flight = in_flight
        self.clock = clock
        self.limit = WAITING_BATCHES * batch_size
        self._keep_for = timedelta(seconds=record_margin + timeout)
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        """Rows waiting over a cap now in every backlog of this pump (thread-safe)."""
        with self._lock:
            return self._count

    def backlog(self) -> CapBacklog:
        """An empty backlog for a pump state (a drain call's or the background loop's)."""
        return CapBacklog(self.limit)

    def admitted(
        self,
        admission: Admission,
        token: uuid.UUID,
        backlog: CapBacklog,
        submit: Submit,
        send_by: dict[int, datetime] | None = None,
    ) -> int:
        """Act on the gate's decision for rows of one claim (``token``): send those it cleared, keep those over a cap
        waiting (``send_by``: when each must go back, for rows that waited before).  Returns how many rows the gate
        gave back unsent, their attempts kept (capped, deferred)."""
        if admission.waiting:
            self._keep(backlog, [
                Waiting(row, delivery, destination, token, (send_by or {}).get(row.id) or self._send_by(row))
                for row, delivery, destination in admission.waiting
            ])
        for send in admission.sends:
            submit(send, token)
        return admission.capped + admission.deferred

    def send_ready(self, backlog: CapBacklog, submit: Submit) -> int:
        """Rows waiting over their cap whose destination has room now go through the gate again
        (``DestinationGate.readmit``).  Returns how many it gave back unsent, as ``admitted``."""
        now = self.clock.now()
        ready = {name for name in backlog.destinations() if self.gate.has_room(name, now=now)}
        if not ready:
            return 0
        entries = self._taken(backlog.take(ready))
        granted = self.in_flight.take(len(entries))
        if granted < len(entries):  # this drainer's other drains hold the places: the rest wait for one
            self._keep(backlog, entries[granted:])
            entries = entries[:granted]
        by_token: dict[uuid.UUID, list[Waiting]] = {}
        for entry in entries:
            by_token.setdefault(entry.token, []).append(entry)
        sent = given_back = 0
        try:
            for token, group in by_token.items():
                admission = self.gate.readmit(
                    [(entry.row, entry.delivery, entry.destination) for entry in group],
                    token=token, now=now, keep=backlog.room,
                )
                sent += len(admission.sends)
                given_back += self.admitted(admission, token, backlog, submit, {entry.row.id: entry.send_by for entry in group})
        finally:  # on an error too (the rate bucket's statement): the rows not sent stay claimed until their lease ends
            self.in_flight.give(granted - sent)
        return given_back

    def expire(self, backlog: CapBacklog) -> int:
        """Rows whose lease no longer leaves room for a send go back unsent; returns how many."""
        return self._give_back(self._taken(backlog.expired(self.clock.now())))

    def give_back(self, backlog: CapBacklog) -> int:
        """Every row still waiting goes back unsent (the pump returns, or may claim no more); returns how many."""
        return self._give_back(self._taken(backlog.take()))

    def forget(self, backlog: CapBacklog) -> None:
        """A drain call gave up (a database error): its rows stay claimed, unsent, until their lease ends; they are
        no longer this pump's to count."""
        self._taken(backlog.take())

    def _give_back(self, entries: list[Waiting]) -> int:
        """Rows that waited over their cap go back unsent, their attempts taken back, in one statement whatever claims
        they came from (``give_back_over_cap``)."""
        if entries:
            rows = [(entry.row, entry.token, entry.destination) for entry in entries]
            self.gate.give_back_over_cap(rows, now=self.clock.now())
        return len(entries)

    def _keep(self, backlog: CapBacklog, entries: list[Waiting]) -> None:
        backlog.add(entries)
        with self._lock:
            self._count += len(entries)

    def _taken(self, entries: list[Waiting]) -> list[Waiting]:
        """Rows removed from a backlog, no longer counted."""
        with self._lock:
            self._count -= len(entries)
        return entries

    def _send_by(self, row: Outbox) -> datetime:
        """The latest a row may wait over its cap: its lease's end, less the time to record and one whole send."""
        assert row.claimed_until is not None  # the claim stamped it
        return row.claimed_until - self._keep_for
