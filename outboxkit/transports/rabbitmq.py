"""RabbitMQ delivery on aio-pika (the ``rabbitmq`` extra: ``pip install 'outboxkit[rabbitmq]'``).

A row goes to ``amqp://host:port/<vhost>?exchange=<name>&routing_key=<key>``
(``%2F`` is the vhost ``/``; no ``exchange`` is the default exchange, where the
routing key is a queue's name; ``amqps://`` for TLS).  It is published with
publisher confirms and ``mandatory`` set, as a persistent message whose
``message_id`` is the row's idempotency key; the delivery's ``key`` travels as
the ``Outboxkit-Key`` header, its ``headers`` as the message's headers, its JSON
as the body (``content_type`` ``application/json``).

aio-pika rather than pika: it is asynchronous like the other broker clients,
so the sends of a batch share one connection and one confirming channel on
the transport's event loop (``outboxkit.transports.event_loop``); pika's
blocking connection may be used by one thread only.

RabbitMQ does not de-duplicate: a retried row can be in a queue twice with the
same ``message_id``, and the consumer drops the copy (docs/transports.md).

The outcome rules:

* accepted (``done``) only on the broker's confirm (``basic.ack``) of a routed
  message: with ``mandatory``, a message no queue is bound for comes back and
  is not accepted;
* ``rejected`` (``stuck`` at once): unroutable (no queue bound for its routing
  key), no such exchange (404), over the broker's ``max_message_size`` (406):
  sending the same message again meets the same answer; bind a queue or
  declare the exchange, then reset the rows;
* refused before sending (``stuck``): a body over the ``max_message_size``
  given to the transport (set it to the broker's).  Sent, such a message makes
  the broker close the channel the batch shares while the client may still be
  writing it: its own answer could be lost in a closed channel or connection;
* retried: the broker down or unreachable, the connection or channel closed
  mid-send (also by another message's 404 or 406: only the message the answer
  names, by its exchange or its size, is stuck), no confirm by the deadline,
  a ``basic.nack`` (the broker could not
  store it), and credentials the broker refuses (they are the transport's, not
  the message's: the breaker holds the rows, attempts kept, until fixed).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from outboxkit.errors import ConfigurationError, InvalidValueError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.event_loop import EventLoopThread

__all__ = ["RabbitMqTransport"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'outboxkit[rabbitmq]'"
KEY_HEADER = "Outboxkit-Key"
# RabbitMQ's own default max_message_size from 3.8 to 3.13 (128 MiB); RabbitMQ 4 lowered it to 16 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 134_217_728
_MISSING_EXCHANGE = re.compile(r"no exchange '(.*)' in vhost")
_TOO_LARGE = re.compile(r"message size (\d+) is larger than configured max size")


def _aio_pika() -> Any:
    """The one place aio-pika is imported."""
    try:
        import aio_pika
        import aio_pika.exceptions
    except ImportError:
        raise ConfigurationError(f"RabbitMqTransport needs aio-pika: {INSTALL_HINT}") from None
    return aio_pika


class RabbitMqTransport:
    """Publishes each delivery with publisher confirms and mandatory routing; never raises for a failed send.

    ``username`` and ``password`` authenticate (RabbitMQ's default is
    ``guest``, which it admits from the same host only); ``connect_timeout``
    bounds making a connection (the send's own deadline bounds it too).
    """

    def __init__(
        self,
        *,
        username: str = "guest",
        password: str = "guest",
        connect_timeout: float = 2.0,
        max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        if max_message_size is not None and (isinstance(max_message_size, bool) or not isinstance(max_message_size, int)
                                             or max_message_size < 1):
            raise InvalidValueError(f"max_message_size must be a positive number of bytes or None, got {max_message_size!r}")
        self._max_message_size = max_message_size
        self._pika = _aio_pika()
        self._credentials = f"{quote(username, safe='')}:{quote(password, safe='')}"
        self._connect_timeout = connect_timeout
        self._loop = EventLoopThread("outboxkit-rabbitmq")
        self._connections: dict[tuple[str, str, str], Any] = {}
        self._channels: dict[tuple[str, str, str], Any] = {}
        self._opening: dict[tuple[str, str, str], asyncio.Lock] = {}

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        parts = urlsplit(delivery.url)
        if parts.scheme not in ("amqp", "amqps"):
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: RabbitMqTransport sends amqp:// URLs, got {parts.scheme}://",
            )
        query = parse_qs(parts.query)
        exchange = query.get("exchange", [""])[0]
        routing_key = query.get("routing_key", [""])[0]
        server = (parts.scheme, parts.netloc, unquote(parts.path[1:]) or "/")
        headers: dict[str, Any] = dict(delivery.headers)
        if delivery.key is not None:
            headers[KEY_HEADER] = delivery.key
        body = delivery.body()
        if body is not None and self._max_message_size is not None and len(body) > self._max_message_size:
            return AttemptResult(
                failure=FailureKind.REJECTED,
                error=f"rejected before sending: the message ({len(body):,} bytes) is larger than the max_message_size "
                f"given to RabbitMqTransport ({self._max_message_size:,} bytes, the broker's limit)",
            )
        message = self._pika.Message(
            body or b"", message_id=idempotency_key, headers=headers,
            content_type="application/json" if body is not None else None,
            delivery_mode=self._pika.DeliveryMode.PERSISTENT,
        )
        try:
            return self._loop.run(self._publish(server, exchange, routing_key, message, timeout), timeout=timeout)
        except TimeoutError:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no publisher confirm within {timeout:g} s")

    async def _publish(
        self, server: tuple[str, str, str], exchange_name: str, routing_key: str, message: Any, timeout: float
    ) -> AttemptResult:
        exceptions = self._pika.exceptions
        try:
            channel = await self._channel(server)
        except (exceptions.AMQPError, OSError, asyncio.TimeoutError, RuntimeError) as exc:  # refused, unreachable, credentials
            await self._forget(server)
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {_describe(exc)}")
        where = f"exchange {exchange_name!r}" if exchange_name else "the default exchange"
        try:
            exchange = channel.default_exchange if not exchange_name else await channel.get_exchange(exchange_name, ensure=False)
            await exchange.publish(message, routing_key=routing_key, mandatory=True, timeout=timeout)
        except exceptions.PublishError as exc:  # came back: no queue is bound for it
            return AttemptResult(
                failure=FailureKind.REJECTED,
                error=f"rejected: unroutable: no queue is bound for routing key {routing_key!r} on {where} ({_describe(exc)})",
            )
        except (exceptions.ChannelNotFoundEntity, exceptions.ChannelPreconditionFailed) as exc:
            if _refuses_this_message(str(exc), exchange_name, len(message.body)):
                error = f"rejected: RabbitMQ closed the channel: {_describe(exc)}"
                return AttemptResult(failure=FailureKind.REJECTED, error=error)
            # Another message's refusal closed the channel this one was on: nothing is wrong with this one.
            return AttemptResult(
                failure=FailureKind.CONNECTION,
                error=f"connection: the channel was closed by another message's refusal ({_describe(exc)})",
            )
        except exceptions.DeliveryError as exc:  # basic.nack
            return AttemptResult(failure=FailureKind.TRANSPORT, error=f"RabbitMQ did not store it: {_describe(exc)}")
        except asyncio.TimeoutError:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no publisher confirm within {timeout:g} s")
        except (exceptions.AMQPConnectionError, OSError, RuntimeError) as exc:  # RuntimeError: "<Connection> closed"
            await self._forget(server)
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {_describe(exc)}")
        except (exceptions.AMQPError, exceptions.ChannelInvalidStateError) as exc:
            return AttemptResult(failure=FailureKind.TRANSPORT, error=_describe(exc))
        return AttemptResult(acknowledgement=f"confirmed by {where}, routing key {routing_key!r}")

    async def _channel(self, server: tuple[str, str, str]) -> Any:
        channel = self._channels.get(server)
        if channel is not None and not channel.is_closed:
            return channel
        async with self._opening.setdefault(server, asyncio.Lock()):  # one open for the sends that wait on it
            channel = self._channels.get(server)
            if channel is not None and not channel.is_closed:
                return channel
            connection = self._connections.get(server)
            if connection is not None and not connection.is_closed:
                # A channel that a refusal closed (404, 406) is replaced; the connection stays.  A connection the
                # broker dropped (a restart) can still say it is open, and refuses a channel with a RuntimeError:
                # it is replaced below.
                try:
                    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                except RuntimeError as exc:
                    logger.debug("the connection to %s is gone (%s); connecting again", server[1], exc)
                else:
                    self._channels[server] = channel
                    return channel
                await self._forget(server)
            scheme, netloc, vhost = server
            url = f"{scheme}://{self._credentials}@{netloc}/{quote(vhost, safe='')}"
            connection = await self._pika.connect(url, timeout=self._connect_timeout)
            self._connections[server] = connection
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            self._channels[server] = channel
            return channel

    async def _forget(self, server: tuple[str, str, str]) -> None:
        self._channels.pop(server, None)
        connection = self._connections.pop(server, None)
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as exc:  # already broken: nothing to flush
                logger.debug("closing the connection to %s: %s", server[1], exc)

    def close(self) -> None:
        async def close_all() -> None:
            for server in list(self._connections):
                await self._forget(server)

        self._loop.close(close_all)
        self._opening.clear()


def _refuses_this_message(answer: str, exchange_name: str, size: int) -> bool:
    """Whether the broker's channel-closing answer names this message (its exchange, or its size), not a neighbour."""
    missing = _MISSING_EXCHANGE.search(answer)
    if missing is not None:
        return missing.group(1) == exchange_name
    too_large = _TOO_LARGE.search(answer)
    if too_large is not None:
        return int(too_large.group(1)) == size
    return True  # another precondition (an argument the exchange refuses): this message's, as far as can be told


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
