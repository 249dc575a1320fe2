"""The operator's own connections: a small pool of its own and a time limit on every transaction.

The admin serves people, the application serves its users; an admin page
must never make the application wait.  So the operator's service
(``outboxkit.operations``, behind the admin and the CLI) does not use the
kit's engine.  ``OperatorDatabase`` builds a second engine from the kit
engine's URL with a pool of its own:

* ``admin_pool_size`` connections, no overflow: however many admin requests
  arrive at once, they hold at most that many connections, and none of the
  application's.  A request that waits longer than ``admin_pool_timeout_seconds``
  for one raises ``OperatorPoolBusy`` (the admin answers 503).
* every transaction has a budget of ``admin_statement_timeout_seconds``,
  counted from the moment it asked for a connection: before each statement,
  PostgreSQL's ``statement_timeout`` is set (``SET LOCAL``, so it ends with the
  transaction and never stays on a pooled connection, also behind a
  transaction-mode pooler) to what is left of it.  A transaction that runs out
  is cancelled by the server and raises ``OperatorQueryTimeout`` ("narrow the
  filter"); its changes are rolled back.  The same ``SET LOCAL`` turns off
  parallel query workers, so one admin scan takes one server process, not three.

The engine is built from the URL alone (with the kit engine's echo and
recycle), and it always pings a pooled connection before handing it out, so
the first call after a server restart succeeds: a ``creator``, ``connect_args`` or connect events of the kit's
engine do not carry over, as for the sync twin of an ``AsyncEngine``
(``outboxkit.storage.database``).  Its sessions are named ``outboxkit-admin`` in
``pg_stat_activity``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sqlalchemy_errors

from outboxkit.errors import OperatorPoolBusy, OperatorQueryTimeout
from outboxkit.settings import OutboxKitSettings

__all__ = ["APPLICATION_NAME", "OperatorDatabase"]

APPLICATION_NAME = "outboxkit-admin"
_DEADLINE_OPTION = "outboxkit_deadline"
# One round trip before each statement: the budget left, and no parallel workers.
_LIMIT_STATEMENT = (
    "SELECT set_config('statement_timeout', %s, true), set_config('max_parallel_workers_per_gather', '0', true)"
)


class OperatorDatabase:
    """The operator's engine over the kit's database (see the module docstring)."""

    def __init__(self, engine: Engine, settings: OutboxKitSettings) -> None:
        self.timeout_seconds = settings.admin_statement_timeout_seconds
        self.pool_size = settings.admin_pool_size
        self.pool_timeout_seconds = settings.admin_pool_timeout_seconds
        self.engine = create_engine(
            engine.url,
            pool_size=self.pool_size,
            max_overflow=0,
            pool_timeout=self.pool_timeout_seconds,
            pool_pre_ping=True,  # a connection a server restart ended is replaced, not handed to an operator's call
            pool_recycle=getattr(engine.pool, "_recycle", -1),
            echo=engine.echo,
            connect_args={"application_name": APPLICATION_NAME},
        )
        event.listen(self.engine, "before_cursor_execute", self._limit_statement)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads (rolled back at the end), within the time limit."""
        with self._limited(begin=False) as connection:
            yield connection

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction that commits at the end unless it raised, within the time limit."""
        with self._limited(begin=True) as connection:
            yield connection

    @contextmanager
    def _limited(self, *, begin: bool) -> Iterator[Connection]:
        deadline = time.monotonic() + self.timeout_seconds
        try:
            with self.engine.begin() if begin else self.engine.connect() as connection:
                connection.execution_options(**{_DEADLINE_OPTION: deadline})
                yield connection
        except sqlalchemy_errors.TimeoutError:  # the pool had no connection to give in time
            raise OperatorPoolBusy(self.pool_size, self.pool_timeout_seconds) from None
        except sqlalchemy_errors.OperationalError as exc:
            if isinstance(exc.orig, psycopg.errors.QueryCanceled):
                raise OperatorQueryTimeout(self.timeout_seconds) from None
            raise

    def _limit_statement(
        self, connection: Connection, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        deadline = connection.get_execution_options().get(_DEADLINE_OPTION)
        left = self.timeout_seconds if deadline is None else deadline - time.monotonic()
        # 0 would mean "no limit" to PostgreSQL: a spent budget is 1 ms, which cancels at once.
        cursor.execute(_LIMIT_STATEMENT, (f"{max(1, int(left * 1000))}ms",))

    def dispose(self) -> None:
        """Close the pool's connections (the engine stays usable, as ``Engine.dispose`` leaves it)."""
        self.engine.dispose()
