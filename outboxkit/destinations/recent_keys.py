"""Keys by when they were last used, so that a table kept per key forgets the keys idle past a bound.

A drainer keeps a little state per destination (the gate's view of it, the
hung sends' answer times).  A process that sends to many destinations would
keep that state for every destination it ever saw; ``RecentKeys`` lets the
owner of such a table forget those it has not used for ``after`` seconds.

``use(key, now, busy=...)`` notes a use and returns the keys idle for
``after`` or more, removed, for the owner to delete from its own tables.  A
key that ``busy`` holds back (a send of it still out) stays, looked at again
one bound later.  The work is amortised: each use looks at the keys least
recently used, oldest first, and stops at the first one used within the
bound, so it costs nothing while every key is recent.

A dict keeps the size of its table when entries leave.  Once the keys kept
fall under an eighth of the most kept since the last compaction (and that
peak was over ``compact_from``), ``use`` compacts its own table and
``compact_due`` says so once, for the owner to copy its tables too: the
memory follows the keys kept, not their peak.

Not thread-safe: the owner calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from outboxkit.errors import InvalidValueError

__all__ = ["COMPACT_FROM", "RecentKeys"]

# Tables for fewer keys than this are never compacted: they are small.
COMPACT_FROM = 1024

K = TypeVar("K", bound=Hashable)


class RecentKeys(Generic[K]):
    """The keys used within ``after`` seconds (any monotonic clock), least recently used first; see the module."""

    def __init__(self, after: float, *, compact_from: int = COMPACT_FROM) -> None:
        if after <= 0:
            raise InvalidValueError(f"after must be positive seconds, not {after!r}")
        self.after = after
        self._compact_from = compact_from
        self._used: OrderedDict[K, float] = OrderedDict()
        self._most = 0  # the most keys kept at once since the last compaction
        self._compact_due = False

    def __len__(self) -> int:
        return len(self._used)

    def __contains__(self, key: object) -> bool:
        return key in self._used

    def keys(self) -> frozenset[K]:
        """The keys kept now."""
        return frozenset(self._used)

    def use(self, key: K, now: float, *, busy: Callable[[K], bool]) -> list[K]:
        """Note ``key`` as used at ``now``; remove and return the keys idle for ``after`` or more that ``busy`` does
        not hold back (those it does are noted as used at ``now``, so looked at again one bound later)."""
        self._used[key] = now
        self._used.move_to_end(key)
        self._most = max(self._most, len(self._used))
        gone: list[K] = []
        while True:
            oldest, used = next(iter(self._used.items()))
            if now - used < self.after:
                break
            if busy(oldest):
                self._used[oldest] = now
                self._used.move_to_end(oldest)
                continue
            del self._used[oldest]
            gone.append(oldest)
        if self._most > self._compact_from and len(self._used) * 8 < self._most:
            self._used = OrderedDict(self._used)
            self._most = len(self._used)
            self._compact_due = True
        return gone

    def compact_due(self) -> bool:
        """Whether the keys kept fell under an eighth of their peak since the last call: the owner copies its
        tables now (amortised over the removals that got them there)."""
        due, self._compact_due = self._compact_due, False
        return due
