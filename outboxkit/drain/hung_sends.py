"""Hung sends: a send out so long that it stops counting against the outbox's concurrency.

A receiver that accepts connections and never answers holds each send for its
whole ``timeout``.  Its destination's cap (``outboxkit.destinations.gate``)
bounds how many of those one drainer holds, but each of them also held one of
the ``concurrency`` send threads and one of the ``batch_size`` places for rows
in flight (``outboxkit.drain.send_pool``), so every other destination's claims were
smaller and its sends fewer until the deadline.  Here a send that has been out
longer than its **threshold** is *hung*: it keeps its thread and its place
under its destination's cap (so one dead destination still holds at most its
cap), but it no longer counts against the outbox's concurrency: the pump
gives its in-flight place back and claims a replacement, and the send pool
runs that replacement on a thread beyond ``concurrency``.

**The bound.** At most ``limit`` sends of one drainer
(``OutboxOptions.hung_send_limit``, by default ``HUNG_SENDS_PER_THREAD`` times
``concurrency``) are hung at once; a send that becomes overdue beyond that
keeps counting as before.  So a drainer runs at most ``concurrency + limit``
send threads, at most ``concurrency`` of them on sends that are not hung (a
hung one waits on its socket: it costs a thread and a connection, no CPU;
many dead destinations at once, one row each, need that many hung sends
before the healthy ones lose a thread), and at most ``batch_size``
rows that are not hung are in flight: a row waits for a send thread exactly as
long as before, and the lease (``OutboxOptions.minimum_lease``) needs nothing
more.  A hung send still ends by its deadline and its outcome is recorded as
any other.

**The threshold** of a send is ``after`` (``OutboxOptions.hung_send_seconds``,
default 1 s), or ``ANSWER_MULTIPLE`` times the slowest of its destination's
last ``ANSWERS_KEPT`` answers here when that is longer: a healthy receiver
that always takes 2 s to answer has a threshold of 8 s, so its sends are not
counted hung and the drain does not double its concurrency against it.  A
destination that has not answered this drainer yet, while others have, is
the likeliest hang (a blackholed partner holds its first sends until their
deadline): its threshold is ``ANSWER_MULTIPLE`` times the slowest of the
outbox's last ``ANSWERS_KEPT`` answers, at least
``FIRST_ANSWER_FLOOR_SECONDS`` (0.1 s) and at most ``after``.  Its first
answer gives it its own threshold; until then what its early sends cost is
bounded, since they keep their places under its cap.  With no answer in the
drainer at all, ``after``.  A send counts from the moment it starts.

**How long answers are kept.**  A destination's answer times are forgotten
once its latest answer is ``ANSWERS_FORGOTTEN_AFTER_SECONDS`` (10 minutes)
old and none of its sends is out: it is then a destination not yet
answered, as in a fresh process, until its next answer.  So a drainer that
sends to many destinations keeps the answers of those that answered it
lately (at most ``ANSWERS_KEPT`` each), not of every destination it ever
sent to.  Forgetting is amortised: each answer looks at the destinations
that answered longest ago, oldest first, and stops at the first recent one.

Thread-safe: send threads call ``started`` and ``finished``; the pump that
handed the send to the pool (its ``owner``, the event queue its outcome goes
to) calls ``mark_overdue`` and ``next_check``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from outboxkit.destinations.recent_keys import RecentKeys
from outboxkit.model import DEFAULT_HUNG_SEND_SECONDS, HUNG_SENDS_PER_THREAD

__all__ = [
    "ANSWERS_FORGOTTEN_AFTER_SECONDS",
    "ANSWERS_KEPT",
    "ANSWER_MULTIPLE",
    "DEFAULT_HUNG_SEND_SECONDS",
    "FIRST_ANSWER_FLOOR_SECONDS",
    "HUNG_SENDS_PER_THREAD",
    "HungSends",
]

# A send is hung only once it has taken this many times its destination's slowest recent answer ...
ANSWER_MULTIPLE = 4.0
# ... over this many of its latest answers here.
ANSWERS_KEPT = 16
# A destination with no send out whose latest answer is this old is forgotten: not yet answered again.
ANSWERS_FORGOTTEN_AFTER_SECONDS = 600.0
# A destination that has not answered yet: hung at this many times the outbox's slowest recent answer, at least
# this long (and at most ``after``).
FIRST_ANSWER_FLOOR_SECONDS = 0.1


@dataclass(slots=True)
class _Out:
    owner: Hashable
    destination: str
    since: float  # time.monotonic() when the send started
    hung: bool = False


class HungSends:
    """One drainer's sends in flight, by when each started; which of them are hung (see the module docstring).

    ``after`` None turns it off: no send is ever hung.  ``on_change`` is
    called with the number of hung sends each time it changes (the send pool
    lets that many threads beyond its size run), under this object's lock.
    """

    def __init__(self, *, after: float | None, limit: int, on_change: Callable[[int], None] | None = None) -> None:
        self.after = after
        self.limit = limit
        self._on_change = on_change
        self._lock = threading.Lock()
        self._out: dict[Hashable, _Out] = {}
        self._answers: dict[str, deque[float]] = {}  # destination -> its latest answer times
        self._answered_lately: RecentKeys[str] = RecentKeys(ANSWERS_FORGOTTEN_AFTER_SECONDS)  # the keys of _answers
        self._any_answers: deque[float] = deque(maxlen=ANSWERS_KEPT)  # every destination's, for one not yet answered
        self._hung = 0
        self._by_destination: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.after is not None

    @property
    def count(self) -> int:
        """Sends hung now."""
        with self._lock:
            return self._hung

    def by_destination(self) -> dict[str, int]:
        """Sends hung now, per destination (only those with one or more)."""
        with self._lock:
            return dict(self._by_destination)

    def threshold(self, destination: str) -> float:
        """How long a send to ``destination`` may be out before it is hung (infinite when turned off)."""
        with self._lock:
            return self._threshold(destination)

    def _threshold(self, destination: str) -> float:
        if self.after is None:
            return float("inf")
        answers = self._answers.get(destination)
        if answers is not None:
            return max(self.after, ANSWER_MULTIPLE * max(answers))
        return self._first_threshold()

    def _thresholds(self) -> dict[str, float]:
        """Under the lock: the threshold of each destination with a send out, as of now (a destination's first
        answer, or the others', may have changed it since its sends started)."""
        return {destination: self._threshold(destination) for destination in {out.destination for out in self._out.values()}}

    def _first_threshold(self) -> float:
        """A destination not answered yet: the shortest threshold any send gets now."""
        assert self.after is not None
        if self._any_answers:  # while the others answer, the likeliest hang
            return min(self.after, max(FIRST_ANSWER_FLOOR_SECONDS, ANSWER_MULTIPLE * max(self._any_answers)))
        return self.after

    def started(self, key: Hashable, *, owner: Hashable, destination: str, now: float | None = None) -> None:
        """A send thread starts the send ``key`` (unique among this drainer's sends in flight)."""
        if self.after is None:
            return
        since = time.monotonic() if now is None else now
        with self._lock:
            self._out[key] = _Out(owner, destination, since)

    def finished(self, key: Hashable, *, answered_in: float | None, now: float | None = None) -> bool:
        """The send ``key`` is over; ``answered_in`` is how long its receiver took to answer (None: no answer, e.g.
        a timeout or a refused connection).  Returns whether it was hung (its in-flight place was given back then)."""
        if self.after is None:
            return False
        clock = time.monotonic() if now is None else now
        with self._lock:
            out = self._out.pop(key, None)
            if out is not None and answered_in is not None:
                self._answered(out.destination, answered_in, clock)
            if out is None or not out.hung:
                return False
            self._hung -= 1
            left = self._by_destination[out.destination] - 1
            if left:
                self._by_destination[out.destination] = left
            else:
                del self._by_destination[out.destination]
            if self._on_change is not None:
                self._on_change(self._hung)
            return True

    def answered(self) -> frozenset[str]:
        """The destinations whose answer times are kept now (see the module docstring)."""
        with self._lock:
            return self._answered_lately.keys()

    def _answered(self, destination: str, answered_in: float, clock: float) -> None:
        """Under the lock: note an answer of ``destination``; forget the answers of destinations that answered
        ``ANSWERS_FORGOTTEN_AFTER_SECONDS`` ago or more and have no send out (the least recently answered first)."""
        answers = self._answers.get(destination)
        if answers is None:
            answers = self._answers[destination] = deque(maxlen=ANSWERS_KEPT)
        answers.append(answered_in)
        self._any_answers.append(answered_in)
        out: set[str] | None = None  # the destinations with a send out, read once if an old one is met

        def sending(key: str) -> bool:  # its threshold is in use: kept, looked at again one bound later
            nonlocal out
            if out is None:
                out = {item.destination for item in self._out.values()}
            return key in out

        for gone in self._answered_lately.use(destination, clock, busy=sending):
            del self._answers[gone]
        if self._answered_lately.compact_due():  # most have gone: the table's memory follows those kept
            self._answers = dict(self._answers)

    def mark_overdue(self, owner: Hashable, *, now: float | None = None) -> int:
        """Mark ``owner``'s sends that are past their threshold as hung, within the bound; returns how many were."""
        if self.after is None:
            return 0
        clock = time.monotonic() if now is None else now
        marked = 0
        with self._lock:
            thresholds = self._thresholds()
            for out in self._out.values():
                if self._hung >= self.limit:
                    break
                if out.owner is owner and not out.hung and clock - out.since >= thresholds[out.destination]:
                    out.hung = True
                    self._hung += 1
                    self._by_destination[out.destination] = self._by_destination.get(out.destination, 0) + 1
                    marked += 1
            if marked and self._on_change is not None:
                self._on_change(self._hung)
        return marked

    def next_check(self, owner: Hashable, *, now: float | None = None) -> float | None:
        """Seconds until ``owner``'s sends must be looked at again: when the next of those out now passes its
        threshold (0 if one has), and at most the shortest threshold a send gets now (one that starts later is
        hung no sooner than that into it, and a send of another owner that ends may make room under the bound).
        None when off."""
        if self.after is None:
            return None
        clock = time.monotonic() if now is None else now
        with self._lock:
            thresholds = self._thresholds()
            ends = [out.since + thresholds[out.destination] for out in self._out.values() if out.owner is owner and not out.hung]
            full = self._hung >= self.limit
            soonest = self._first_threshold()
        if full or not ends:
            return soonest
        return min(soonest, max(0.0, min(ends) - clock))
