"""What the broker inbox tests share: the business handler, the transports' own sends, and awaiting a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from outboxkit.inbox.brokers import BrokerMessage
from outboxkit.transports.base import Delivery, Transport
from tests.support.inbox import apply

SOURCE = "orders"


class Handler:
    """Applies each message (``applied`` counter +1) and notes every call; raises for the ids in ``failing``.

    ``failing`` maps an id to how many deliveries fail before one succeeds (``None``: every one fails).
    """

    def __init__(self, failing: dict[str, int | None] | None = None) -> None:
        self.failing = dict(failing or {})
        self.calls: list[str] = []

    def __call__(self, session: Session, message: BrokerMessage) -> None:
        self.calls.append(message.message_id)
        left = self.failing.get(message.message_id, 0)
        if left is None or left > 0:
            if left is not None:
                self.failing[message.message_id] = left - 1
            raise RuntimeError(f"cannot apply {message.message_id} yet")
        assert message.json()["id"] == message.message_id
        apply(session, message.message_id)


def send_all(transport: Transport, url: str, ids: list[str]) -> None:
    """Each id sent once through outboxkit's own transport, as the drain sends a row whose key it is."""
    for message_id in ids:
        result = transport.send(Delivery(url=url, json={"id": message_id}), idempotency_key=message_id, timeout=10.0)
        assert result.acknowledgement is not None, result.error


def counts(engine: Engine) -> tuple[int, int]:
    """The source's (duplicates, handler failures)."""
    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT duplicates, handler_failures FROM outboxkit_inbox_sources WHERE source = :source"),
            {"source": SOURCE},
        ).first()
    return (row[0], row[1]) if row is not None else (0, 0)


async def holds(value: bool) -> bool:
    """``value``, awaitable: a condition for ``wait_for`` that needs no broker call."""
    return value


async def wait_for(condition: Callable[[], Awaitable[bool]], *, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s")
        await asyncio.sleep(0.05)


class Outage:
    """The test's own database refusing connections (``ALLOW_CONNECTIONS false``, its sessions ended), then back.

    Only the test's database: the server and every other database keep running.
    """

    def __init__(self, database_url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        from tests.support.database import sqlalchemy_url

        url = make_url(sqlalchemy_url(database_url))
        self.name = url.database
        self.server = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def begin(self) -> None:
        with self.server.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{self.name}" WITH ALLOW_CONNECTIONS false'))
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"), {"name": self.name}
            )

    def end(self) -> None:
        with self.server.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{self.name}" WITH ALLOW_CONNECTIONS true'))

    def close(self) -> None:
        self.end()
        self.server.dispose()
