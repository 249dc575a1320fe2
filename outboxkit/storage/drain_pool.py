"""The drain's own connections: a pool of its own, never the application's.

The drain's claims, its outcome writes, its short reads (pause, earliest due,
destination state) and its session connections (LISTEN, the leader lock)
used to come from the engine the application gives the kit, beside the
application's own requests.  With SQLAlchemy's default pool (5, plus 10
overflow) the two then wait for each other: a busy drain makes requests queue
for a connection, and a busy application slows delivery.  ``DrainDatabase``
builds a second engine over the same database for the drain alone, the way
``outboxkit.storage.operator_pool`` builds the admin's:

* **What it connects with.** The application engine's own connection factory
  (its URL, ``connect_args``, a ``creator`` and ``do_connect`` hooks such as
  short-lived IAM tokens), so the drain connects exactly as the application
  does, PgBouncer's ``prepare_threshold`` included; its echo and recycle.
  Pool events of the application's engine (``connect``, ``checkout``) do not
  carry over.  It always pings a pooled connection before handing it out, so
  the first claim after a server restart succeeds.
* **Its size.** ``OUTBOXKIT_DRAIN_POOL_SIZE`` connections, or by default two
  per outbox plus one: each drain loop keeps one connection for its claims and
  outcomes (``outboxkit.drain.pump``), and takes a second one for a moment
  (pause check, earliest due, a destination's state).  Sends hold no
  connection (the claim commits before the send, the outcome is written after),
  so neither ``concurrency`` nor ``batch_size`` adds connections; the overflow,
  as large again, is for drains that run beside the loops (the elected
  safety-net drain, an operator's "drain now", ``kit.drain()``), opened only
  while they run.  A drain that finds every connection busy waits up to
  ``OUTBOXKIT_DRAIN_POOL_TIMEOUT_SECONDS``; a drain loop logs the error and
  retries with backoff.
* **Seen from outside.** ``checked_out`` and ``waiting`` (threads waiting for
  a connection now) feed the metrics ``outboxkit_drain_pool_checked_out`` and
  ``outboxkit_drain_pool_waiting``.

The session connections (LISTEN, the leader lock) are detached from this pool
when opened (``outboxkit.storage.connections``), so they take none of its slots.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from outboxkit.model import OutboxOptions
from outboxkit.settings import OutboxKitSettings

__all__ = ["DrainDatabase", "drain_pool_size"]

# Connections per outbox: the loop's claim-and-outcome connection and a short one beside it.
CONNECTIONS_PER_OUTBOX = 2


def drain_pool_size(settings: OutboxKitSettings, outboxes: Iterable[OutboxOptions]) -> int:
    """The drain pool's size: ``drain_pool_size`` when set, else two per outbox plus one."""
    if settings.drain_pool_size:
        return settings.drain_pool_size
    return CONNECTIONS_PER_OUTBOX * sum(1 for _ in outboxes) + 1


class _CountingQueuePool(QueuePool):
    """A ``QueuePool`` that counts the threads waiting for one of its connections."""

    # SQLAlchemy names a pool's logger after its class's module: keep its lines ("Pool disposed") under
    # sqlalchemy.pool, beside every other pool's, not among the kit's own log events.
    __module__ = "sqlalchemy.pool.impl"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_lock = threading.Lock()
        self.waiting = 0

    def _do_get(self) -> ConnectionPoolEntry:
        # Counted only when the checkout will block: every connection is out and none may be added.
        blocks = self._overflow >= self._max_overflow and self._pool.empty()
        if not blocks:
            return super()._do_get()
        with self._waiting_lock:
            self.waiting += 1
        try:
            return super()._do_get()
        finally:
            with self._waiting_lock:
                self.waiting -= 1


class DrainDatabase:
    """The drain's engine over the application's database (see the module docstring)."""

    def __init__(self, engine: Engine, settings: OutboxKitSettings, *, size: int) -> None:
        self.pool_size = size
        self.max_overflow = size
        self.pool_timeout_seconds = settings.drain_pool_timeout_seconds
        options: dict[str, Any] = {
            "poolclass": _CountingQueuePool,
            "pool_size": self.pool_size,
            "max_overflow": self.max_overflow,
            "pool_timeout": self.pool_timeout_seconds,
            "pool_pre_ping": True,  # a connection a server restart ended is replaced, not handed to a claim
            "pool_recycle": getattr(engine.pool, "_recycle", -1),
            "echo": engine.echo,
        }
        # The application engine's connection factory: its URL, connect_args, creator and do_connect hooks.
        creator = getattr(engine.pool, "_creator", None)
        if creator is not None:
            options["creator"] = creator
        self.engine = create_engine(engine.url, **options)

    @property
    def _pool(self) -> _CountingQueuePool:
        pool = self.engine.pool
        assert isinstance(pool, _CountingQueuePool)
        return pool

    @property
    def checked_out(self) -> int:
        """Connections of the drain's pool in use now."""
        return self._pool.checkedout()

    @property
    def waiting(self) -> int:
        """Threads of the drain waiting for one of its connections now."""
        return self._pool.waiting

    def dispose(self) -> None:
        """Close the pool's connections (the engine stays usable, as ``Engine.dispose`` leaves it)."""
        self.engine.dispose()
