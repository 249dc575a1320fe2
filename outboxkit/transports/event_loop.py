"""One asyncio event loop on a thread of its own, shared by the sends of one broker transport.

The broker clients (nats-py, redis's asyncio client) are asynchronous, and the
drain calls ``Transport.send`` from its send threads.  Each send hands its
coroutine to this loop and waits for it at most until its deadline, so the
sends of a claimed batch are in flight together on one connection per broker:
a broker acknowledges them as they come, and the batch costs about one round
trip, not one per row.

A send whose deadline passes is cancelled on the loop and reported as a
``TimeoutError`` to its caller, who turns it into a ``timeout`` attempt (the
row is retried with the same de-duplication id).  ``close`` runs the
transport's own clean-up coroutine on the loop, then stops the loop and joins
its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["EventLoopThread"]

T = TypeVar("T")
_CLOSE_WAIT = 5.0


class EventLoopThread:
    """An event loop started on first use, on a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], *, timeout: float) -> T:
        """``coroutine``'s result, or ``TimeoutError`` once ``timeout`` seconds pass (the coroutine is then cancelled)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._started())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self, clean_up: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run ``clean_up`` on the loop (bounded), stop the loop and join its thread; a later ``run`` starts a new one."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if clean_up is not None:
            async def bounded() -> None:
                await asyncio.wait_for(clean_up(), _CLOSE_WAIT)

            try:
                asyncio.run_coroutine_threadsafe(bounded(), loop).result(_CLOSE_WAIT + 1)
            except Exception:  # closing: a broker that does not answer must not hold the process
                pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_WAIT)
        if not thread.is_alive():
            loop.close()
