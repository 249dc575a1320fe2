"""What the broker consumers share: the message a handler gets, and one message handled off the event loop.

The broker consumers (``outboxkit.inbox.nats``, ``outboxkit.inbox.rabbitmq``,
``outboxkit.inbox.redis_streams``) each turn their broker's message into a
``BrokerMessage`` and hand it to ``BrokerInbox.consume``, which records and
handles it in one transaction (``outboxkit.inbox.consumer.InboxConsumer``) on
a worker thread, so the broker client's event loop keeps running.  The order
every consumer keeps is the one that makes the effect happen once:

1. record the message and run the handler in one transaction, and commit;
2. only then acknowledge the broker.

A crash between 1 and 2 leaves the message unacknowledged: the broker
delivers it again, its record is found, and it is acknowledged without
running the handler.  A handler that raises rolls its writes and the record
back; ``consume`` returns None and the consumer leaves the message to the
broker's redelivery, which each broker bounds its own way (a maximum number of
deliveries, then a dead letter; see each module).

The message id is the one outboxkit's broker transports send (the row's
idempotency key, the same on every attempt), read by each consumer from the
broker's own place for it.  A message without one cannot be told apart from
its copies, so it is never handled: it counts as a handler failure and goes
the way of the broker's redelivery and dead letters.

None of these modules imports a broker client: the application connects and
subscribes with its own client (the ``nats``, ``redis`` or ``rabbitmq``
extra, the same the transports use) and gives the messages to the consumer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidValueError
from outboxkit.inbox.consumer import ConsumeOutcome, InboxConsumer, InboxObserver
from outboxkit.inbox.store import MESSAGE_ID_LIMIT
from outboxkit.telemetry.log_events import log_fields

__all__ = ["DEFAULT_RETRY_DELAY_SECONDS", "BrokerHandler", "BrokerInbox", "BrokerMessage", "RedeliveringInbox"]

logger = logging.getLogger(__name__)

DEFAULT_RETRY_DELAY_SECONDS = 5.0


@dataclass(frozen=True)
class BrokerMessage:
    """One message from a broker: its id (the sender's idempotency key), its body, headers and ordering key.

    ``deliveries`` is how many times the broker has delivered it, this time
    included, where the broker says (None where it does not).
    """

    message_id: str
    body: bytes = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None
    deliveries: int | None = None

    def json(self) -> Any:
        """The body parsed as JSON (outboxkit's transports send the delivery's JSON); ``ValueError`` if it is not."""
        return json.loads(self.body)


BrokerHandler = Callable[[Session, BrokerMessage], None]


class BrokerInbox:
    """Messages of one ``source`` from a broker, each handled once by ``handler(session, message)``.

    ``engine`` is the consumer's own database (sync psycopg), where the
    handler's writes and the inbox records go; ``observers`` hear each
    outcome (e.g. ``OutboxMetrics(kit).inbox``).
    """

    def __init__(
        self, engine: Engine, *, source: str, handler: BrokerHandler, observers: Iterable[InboxObserver] = ()
    ) -> None:
        self.consumer = InboxConsumer(engine, source=source, observers=observers)
        self.handler = handler

    @property
    def source(self) -> str:
        return self.consumer.source

    async def consume(self, message: BrokerMessage) -> ConsumeOutcome | None:
        """Record and handle ``message`` in one transaction on a thread: its outcome after the commit, None if it failed.

        A failure (the handler raised, the database failed, the message has
        no usable id) is logged and counted for the source, and its writes are
        rolled back: acknowledge nothing, and the broker delivers it again.
        """
        if not 1 <= len(message.message_id) <= MESSAGE_ID_LIMIT or not message.message_id.isprintable():
            self.consumer.count_failure(
                message.message_id or "(none)",
                InvalidValueError(
                    f"the message has no usable id (1 to {MESSAGE_ID_LIMIT} printable characters), so its copies "
                    f"cannot be told apart; it was not handled"
                ),
            )
            return None
        try:
            return await asyncio.to_thread(
                self.consumer.consume, message.message_id, lambda session: self.handler(session, message)
            )
        except Exception:  # logged and counted by InboxConsumer; the broker redelivers
            return None

    def acknowledgement_lost(self, message_id: str, exc: BaseException) -> None:
        """Log an acknowledgement that did not reach the broker: the message comes again and is dropped as a duplicate."""
        logger.warning(
            "inbox %s: message %s was handled and committed, but its acknowledgement failed (%s: %s); "
            "the broker delivers it again and its copy is dropped as a duplicate",
            self.source, message_id, type(exc).__name__, exc,
            extra=log_fields("inbox.ack_failed", None, source=self.source, message_id=message_id),
        )


class RedeliveringInbox(BrokerInbox):
    """A consumer of a broker that redelivers what it is given back (NATS, RabbitMQ).

    ``retry_delay_seconds`` is how long a failed message waits before it is
    delivered again.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        source: str,
        handler: BrokerHandler,
        retry_delay_seconds: float = DEFAULT_RETRY_DELAY_SECONDS,
        observers: Iterable[InboxObserver] = (),
    ) -> None:
        super().__init__(engine, source=source, handler=handler, observers=observers)
        self.retry_delay_seconds = retry_delay_seconds

    async def settle(
        self, message: BrokerMessage, *, acknowledge: Callable[[], Awaitable[None]], give_back: Callable[[], Awaitable[None]]
    ) -> ConsumeOutcome | None:
        """``consume``, then ``acknowledge()`` after the commit, or ``give_back()`` on a failure; the outcome."""
        outcome = await self.consume(message)
        try:
            await (give_back() if outcome is None else acknowledge())
        except Exception as exc:  # the connection broke: the broker delivers the message again
            if outcome is not None:
                self.acknowledgement_lost(message.message_id, exc)
        return outcome


def text_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """A broker's headers as text (bytes decoded, numbers written out), for ``BrokerMessage.headers``."""
    return {
        str(name): value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        for name, value in (headers or {}).items()
    }
