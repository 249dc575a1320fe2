"""The drain's sending machinery: a bounded thread pool and the in-flight limit.

Two small pieces the drain (``outboxkit.drain``) builds on:

* ``SendPool``: ``size`` threads that run sends.  ``ThreadPoolExecutor``
  builds a Future (with its Condition) per job; the drain never reads it,
  since each send hands its result to the recording thread itself, and that
  bookkeeping was a visible share of the drainer's CPU.
* ``InFlightLimit``: how many rows one drainer holds between their claim and
  their recorded outcome, summed over every drain of that drainer running at
  once in the process (the background loop, the leader's safety-net drain, a
  ``drain --once`` from a script).  It is what makes the lease provable: at
  most ``batch_size`` rows wait for ``concurrency`` send threads, so a claimed
  row is sent within ``ceil(batch_size / concurrency)`` rounds of sends, each
  bounded by the transport's total deadline (``OutboxOptions.minimum_lease``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from outboxkit.errors import KitClosedError

__all__ = ["InFlightLimit", "SendPool"]


class SendPool:
    """``size`` threads that run sends: bounded concurrency without futures.

    Jobs must not raise.  Threads start on the first job and end at
    ``shutdown()``, after finishing every queued job.
    """

    def __init__(self, size: int, *, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[object, ...]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut_down = False

    def submit(self, function: Callable[..., None], *arguments: object) -> None:
        if not self._threads or self._shut_down:
            with self._lock:
                if self._shut_down:
                    raise KitClosedError("this drainer is closed")
                while len(self._threads) < self._size:
                    thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                    thread.start()
                    self._threads.append(thread)
        self._jobs.put((function, arguments))

    def shutdown(self) -> None:
        """Let queued jobs finish, then stop the threads."""
        with self._lock:
            self._shut_down = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            function, arguments = job
            function(*arguments)


class InFlightLimit:
    """A count of rows held between claim and outcome, never above ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def take(self, wanted: int) -> int:
        """Reserve up to ``wanted`` rows; returns how many were granted (maybe 0)."""
        with self._lock:
            granted = max(0, min(wanted, self.limit - self._held))
            self._held += granted
            return granted

    def give(self, count: int) -> None:
        """Hand back ``count`` reserved rows (outcomes recorded, or claimed fewer than granted)."""
        if count:
            with self._lock:
                self._held -= count
                assert self._held >= 0, "more in-flight rows handed back than taken"
