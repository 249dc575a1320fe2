"""The drain's sending machinery: a bounded thread pool and the in-flight limit.

Two small pieces the drain (``outboxkit.drain``) builds on:

* ``SendPool``: at most ``size`` threads that run sends.  ``ThreadPoolExecutor``
  builds a Future (with its Condition) per job; the drain never reads it,
  since each send hands its result to the recording thread itself, and that
  bookkeeping was a visible share of the drainer's CPU.  A job goes to the
  thread that went idle last (a stack, not a queue), and a thread is started
  only when every started one is busy.  Each send thread keeps its own HTTP
  connections (``outboxkit.transports.http``), so a drainer that sends one row
  at a time sends each on the same warm keep-alive connection: with a shared
  queue the rows went round the threads in turn, each thread's connection
  sat idle ``size`` times longer (past the keep-alive expiry at low rates),
  and 32 to 45 of 200 rows in ``bench/latency.py`` opened a new connection
  (a connect, and a TLS handshake for ``https://``, on the idle-latency
  path; docs/performance.md).
  Sends that have hung (``outboxkit.drain.hung_sends``) stop counting against
  ``size``: ``allow_extra(n)`` lets ``n`` more threads run (at most
  ``max_extra`` more), so at most ``size`` threads run sends that are not hung
  and at most ``size + max_extra`` threads run at all.
* ``InFlightLimit``: how many rows one drainer holds between their claim and
  their recorded outcome, summed over every drain of that drainer running at
  once in the process (the background loop, the leader's safety-net drain, a
  ``drain --once`` from a script).  It is what makes the lease provable: at
  most ``batch_size`` rows wait for ``concurrency`` send threads, so a claimed
  row is sent within ``ceil(batch_size / concurrency)`` rounds of sends, each
  bounded by the transport's total deadline (``OutboxOptions.minimum_lease``).
  A hung send's row gives its place back (the drain calls ``give`` when it
  hangs, not again when it ends): it has started, and the rows still waiting
  run on ``concurrency`` threads besides the hung ones, so the bound on the
  rows that wait, and the lease, are as before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from outboxkit.errors import KitClosedError

__all__ = ["InFlightLimit", "SendPool"]

_Job = tuple[Callable[..., None], tuple[object, ...]]


class _Idle:
    """A send thread waiting for its next job: ``submit`` sets ``job`` and releases ``ready``."""

    __slots__ = ("job", "ready")

    def __init__(self) -> None:
        self.job: _Job | None = None
        self.ready = threading.Lock()
        self.ready.acquire()  # held until a job (or the shutdown) is handed over


class SendPool:
    """At most ``size`` threads that run sends: bounded concurrency without futures.

    A job goes to the most recently idle thread; with none idle, a new
    thread starts while fewer than ``size`` run, else the job waits in a
    queue (first in, first out) for the next thread that finishes.  Jobs must
    not raise.  ``shutdown()`` lets every queued job finish, then ends the
    threads.
    """

    def __init__(self, size: int, *, name: str, max_extra: int | None = None) -> None:
        self._size = size
        self._max_extra = size if max_extra is None else max_extra  # threads beyond size allow_extra may allow
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []  # the thread that went idle last is at the end
        self._queued: deque[_Job] = deque()  # jobs that found every thread busy
        self._threads: list[threading.Thread] = []
        self._extra = 0  # threads beyond size allowed to run: as many as sends have hung (allow_extra)
        self._shut_down = False

    @property
    def threads(self) -> int:
        """How many send threads have been started."""
        with self._lock:
            return len(self._threads)

    @property
    def idle(self) -> int:
        """How many of them wait for a job now."""
        with self._lock:
            return len(self._idle)

    @property
    def extra(self) -> int:
        """How many threads beyond ``size`` may run now (``allow_extra``)."""
        with self._lock:
            return self._extra

    def submit(self, function: Callable[..., None], *arguments: object) -> None:
        job: _Job = (function, arguments)
        with self._lock:
            if self._shut_down:
                raise KitClosedError("this drainer is closed")
            if not self._start(job):
                self._queued.append(job)

    def allow_extra(self, count: int) -> None:
        """Let ``count`` threads beyond ``size`` run (as many as sends have hung; at most ``max_extra``); queued jobs
        start at once on the room it makes.  A lower count takes effect as running jobs end."""
        with self._lock:
            self._extra = max(0, min(count, self._max_extra))
            while self._queued and self._start(self._queued[0]):
                self._queued.popleft()

    def _start(self, job: _Job) -> bool:
        """Under the lock: run ``job`` now on an idle thread or a new one, if fewer than ``size + extra`` are busy."""
        busy = len(self._threads) - len(self._idle)
        if busy >= self._size + self._extra:
            return False
        if self._idle:
            idle = self._idle.pop()
            idle.job = job
            idle.ready.release()
            return True
        thread = threading.Thread(target=self._work, args=(job,), name=f"{self._name}-{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return True

    def shutdown(self) -> None:
        """Let queued jobs finish, then stop the threads."""
        with self._lock:
            self._shut_down = True
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for waiting in idle:
            waiting.ready.release()  # with no job: the thread ends
        for thread in threads:
            thread.join()

    def _work(self, job: _Job | None) -> None:
        idle = _Idle()
        while job is not None:
            function, arguments = job
            function(*arguments)
            if self._queued and len(self._threads) <= self._size:
                # Busy: the next queued job, without the lock.  With no thread beyond size ever started, this
                # thread's place is always within size + extra.
                try:
                    job = self._queued.popleft()
                    continue
                except IndexError:  # another thread took the last one meanwhile
                    pass
            with self._lock:  # going idle: looked at again under the lock, which submit() queues under
                busy = len(self._threads) - len(self._idle)  # this thread included (and any ended by shutdown)
                if self._queued and (busy <= self._size + self._extra or self._shut_down):
                    job = self._queued.popleft()
                    continue
                if self._shut_down:
                    return
                idle.job = None
                self._idle.append(idle)
            idle.ready.acquire()
            job = idle.job


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
