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

A failure while the consumer's database cannot be reached is not the
message's: giving it back would spend its deliveries, and an outage longer
than the redelivery bound would turn every message into a dead letter.  So
when a failure comes with a database that does not answer ``SELECT 1``,
``consume`` keeps the message (unacknowledged; ``keep_alive`` tells the broker
it is still in hand, where the broker needs it), probes the database at
growing intervals (``DATABASE_PROBE_SECONDS``), and handles the message again
once it answers.  A failure with the database answering is the message's
(or the handler's), and goes the way above.

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
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidValueError
from outboxkit.inbox.consumer import ConsumeOutcome, InboxConsumer, InboxObserver
from outboxkit.inbox.store import MESSAGE_ID_LIMIT
from outboxkit.telemetry.log_events import log_fields

__all__ = [
    "DATABASE_PROBE_SECONDS", "DEFAULT_RETRY_DELAY_SECONDS", "BrokerHandler", "BrokerInbox", "BrokerMessage", "RedeliveringInbox",
]

logger = logging.getLogger(__name__)

DEFAULT_RETRY_DELAY_SECONDS = 5.0
# The waits between probes of a database that does not answer, the last repeated.
DATABASE_PROBE_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)


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

    async def consume(
        self, message: BrokerMessage, *, keep_alive: Callable[[], Awaitable[None]] | None = None
    ) -> ConsumeOutcome | None:
        """Record and handle ``message`` in one transaction on a thread: its outcome after the commit, None if it failed.

        A failure (the handler raised, the message has no usable id) is
        logged and counted for the source, and its writes are rolled back:
        acknowledge nothing, and the broker delivers it again.  While the
        database cannot be reached, the message is kept and handled again
        when it answers (module docstring); ``keep_alive`` is awaited between
        probes.
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
        while True:
            try:
                return await asyncio.to_thread(
                    self.consumer.consume, message.message_id, lambda session: self.handler(session, message)
                )
            except Exception:  # logged and counted by InboxConsumer
                if await asyncio.to_thread(self._database_answers):
                    return None  # the message's failure: the broker delivers it again
            await self._wait_for_database(message.message_id, keep_alive)

    def _database_answers(self) -> bool:
        # Twice: a connection the outage broke fails the first try and empties the pool; the second connects afresh.
        for _ in range(2):
            try:
                with self.consumer.engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
                return True
            except Exception:
                continue
        return False

    async def _wait_for_database(self, message_id: str, keep_alive: Callable[[], Awaitable[None]] | None) -> None:
        logger.warning(
            "inbox %s: the database does not answer; message %s is kept, unacknowledged, until it does",
            self.source, message_id,
            extra=log_fields("inbox.database_unavailable", None, source=self.source, message_id=message_id),
        )
        for attempt in itertools.count():
            await asyncio.sleep(DATABASE_PROBE_SECONDS[min(attempt, len(DATABASE_PROBE_SECONDS) - 1)])
            if keep_alive is not None:
                try:
                    await keep_alive()
                except Exception as exc:  # the broker's connection broke: it delivers the message again anyway
                    logger.debug("inbox %s: keep-alive of %s failed: %s", self.source, message_id, exc)
            if await asyncio.to_thread(self._database_answers):
                return

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
        self,
        message: BrokerMessage,
        *,
        acknowledge: Callable[[], Awaitable[None]],
        give_back: Callable[[], Awaitable[None]],
        keep_alive: Callable[[], Awaitable[None]] | None = None,
    ) -> ConsumeOutcome | None:
        """``consume``, then ``acknowledge()`` after the commit, or ``give_back()`` on a failure; the outcome."""
        outcome = await self.consume(message, keep_alive=keep_alive)
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
