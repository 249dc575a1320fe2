"""The receiver's log for fault scenarios: every request's arrival, stamped before it is answered.

An ``ArrivalLog`` takes over a ``tests.support.receiver.Receiver``: for each
request it notes the idempotency key, the attempt number and worker the
request carries, how many times that key has now arrived, and the arrival
time, read from the database clock when one is given (so it can be compared
with the due times the drains wrote), then asks the scenario's ``respond``
for the reply.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from tests.faults.postgres import DatabaseClock
from tests.support.receiver import Receiver, Reply, Request

__all__ = ["Arrival", "ArrivalLog"]


@dataclass(frozen=True)
class Arrival:
    key: str | None
    attempt: int | None  # the row's attempt number, from the X-Attempt header
    worker: str | None  # X-Fault-Worker: which drain process sent it
    behaviour: str | None
    nth: int  # the how-manyth arrival of this key, this one included
    at: datetime  # on the database clock if the log has one, else the receiver's
    reply: Reply | None = None


def _header(request: Request, name: str) -> str | None:
    for header, value in request.headers.items():
        if header.lower() == name.lower():
            return value
    return None


class ArrivalLog:
    """Logs and answers every request the receiver gets."""

    def __init__(
        self, receiver: Receiver, respond: Callable[[Arrival], Reply], *, clock: DatabaseClock | None = None
    ) -> None:
        self.receiver = receiver
        self.url = receiver.url
        self._respond = respond
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: collections.Counter[str | None] = collections.Counter()
        self._arrivals: list[Arrival] = []
        receiver.respond = self._answer

    def _answer(self, request: Request) -> Reply:
        at = self._clock.now() if self._clock is not None else datetime.fromtimestamp(request.received_at, timezone.utc)
        attempt = _header(request, "X-Attempt")
        body = request.body if isinstance(request.body, dict) else {}
        with self._lock:
            self._seen[request.key] += 1
            nth = self._seen[request.key]
        arrival = Arrival(
            key=request.key,
            attempt=int(attempt) if attempt and attempt.isdigit() else None,
            worker=_header(request, "X-Fault-Worker"),
            behaviour=body.get("behaviour"),
            nth=nth,
            at=at,
        )
        reply = self._respond(arrival)
        with self._lock:
            self._arrivals.append(dataclasses.replace(arrival, reply=reply))
        return reply

    def arrivals(self) -> list[Arrival]:
        with self._lock:
            return list(self._arrivals)

    def __len__(self) -> int:
        with self._lock:
            return len(self._arrivals)

    def counts(self) -> collections.Counter[str | None]:
        with self._lock:
            return collections.Counter(self._seen)
