"""The brokers of the broker fault scenarios, each behind one small interface.

A ``BrokerTarget`` starts a real broker of its own (tests/support/brokers.py) set up so that what it acknowledged
survives a restart (JetStream's file store, Redis's append-only file with an fsync per write, a durable RabbitMQ
queue of persistent messages), gives the row URL that reaches it, a transport for it (in this process or, by name, in
a worker process), and reads back every message it stored: the idempotency key of each, so a scenario counts what is
missing and what is there twice.

``FAULT_OPTIONS`` are the ``SampleEvent`` options the scenarios drain with: one-second deadlines, a two-second lease
margin (a killed worker's rows come back within seconds), retries within a second, and attempts enough that no row
ends stuck while its broker is away.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from outboxkit.transports.base import Transport
from tests.support.brokers import NatsServer, RabbitMqServer, RedisServer
from tests.support.models import SampleEvent

__all__ = ["FAULT_OPTIONS", "TRANSPORTS", "BrokerTarget", "Stored", "make_transport", "start_target"]

FAULT_OPTIONS = dataclasses.replace(
    SampleEvent.__outbox__, timeout=1.0, lease_margin=2.0, backoff=(0.2, 0.5, 1.0), max_attempts=200,
)
TRANSPORTS = ("nats", "redis", "rabbitmq")
T = TypeVar("T")
STREAM, SUBJECT, QUEUE = "FAULTS", "faults.orders", "orders"


def make_transport(name: str) -> Transport:
    """A fresh transport of the broker named ``name`` (one of ``TRANSPORTS``)."""
    if name == "nats":
        from outboxkit.transports.nats import NatsTransport

        return NatsTransport()
    if name == "redis":
        from outboxkit.transports.redis_streams import RedisStreamsTransport

        return RedisStreamsTransport()
    if name == "rabbitmq":
        from outboxkit.transports.rabbitmq import RabbitMqTransport

        return RabbitMqTransport()
    raise ValueError(f"unknown transport {name!r}; one of {TRANSPORTS}")


@dataclass(frozen=True)
class Stored:
    """What a broker holds: how many copies of each idempotency key."""

    copies: Counter[str]

    def missing(self, keys: set[str]) -> set[str]:
        return keys - set(self.copies)

    @property
    def duplicates(self) -> int:
        """Messages stored beyond the first of their key."""
        return sum(count - 1 for count in self.copies.values())


@dataclass
class BrokerTarget:
    """A running broker, the URL rows address it with, and how to read back what it stored."""

    name: str
    server: NatsServer | RedisServer | RabbitMqServer
    url: str
    _read: Callable[[], list[str]]

    def stored(self) -> Stored:
        return Stored(Counter(self._read()))

    def restart(self) -> None:
        """Stop the broker process by its pid (a clean stop) and start it again on the same port and data folder."""
        self.server.stop()
        self.server.start()

    def close(self) -> None:
        self.server.close()


def start_target(name: str) -> BrokerTarget:
    """The broker named ``name`` started, with its stream or queue declared."""
    if name == "nats":
        nats_server = NatsServer()
        nats_server.start()
        _run_nats(nats_server, _add_stream)
        return BrokerTarget(name, nats_server, f"{nats_server.url}/{SUBJECT}", lambda: _run_nats(nats_server, _nats_keys))
    if name == "redis":
        redis_server = RedisServer(persistent=True)
        redis_server.start()
        return BrokerTarget(name, redis_server, f"{redis_server.url}/0/{QUEUE}", lambda: _redis_keys(redis_server))
    if name == "rabbitmq":
        rabbitmq_server = RabbitMqServer()
        rabbitmq_server.start()
        asyncio.run(_rabbitmq(rabbitmq_server, read=False))
        return BrokerTarget(
            name, rabbitmq_server, f"{rabbitmq_server.url}/%2F?exchange={QUEUE}&routing_key={QUEUE}",
            lambda: asyncio.run(_rabbitmq(rabbitmq_server, read=True)),
        )
    raise ValueError(f"unknown transport {name!r}; one of {TRANSPORTS}")


def _run_nats(server: NatsServer, action: Callable[[Any], Awaitable[T]]) -> T:
    import nats

    async def run() -> T:
        client = await nats.connect(server.url)
        try:
            return await action(client.jetstream())
        finally:
            await client.close()

    return asyncio.run(run())


async def _add_stream(jetstream: Any) -> None:
    from nats.js.api import StorageType, StreamConfig

    await jetstream.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE))


async def _nats_keys(jetstream: Any) -> list[str]:
    info = await jetstream.stream_info(STREAM)
    subscription = await jetstream.pull_subscribe(SUBJECT, durable="reader", stream=STREAM)
    keys: list[str] = []
    while len(keys) < info.state.messages:
        for message in await subscription.fetch(min(500, info.state.messages - len(keys)), timeout=10):
            keys.append(message.headers["Nats-Msg-Id"])
            await message.ack()
    return keys


def _redis_keys(server: RedisServer) -> list[str]:
    import redis

    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        return [fields[b"idempotency_key"].decode() for _, fields in client.xrange(QUEUE)]


async def _rabbitmq(server: RabbitMqServer, *, read: bool) -> list[str]:
    import aio_pika

    connection = await aio_pika.connect(f"{server.url}/%2F")
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(QUEUE, aio_pika.ExchangeType.DIRECT, durable=True)
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.bind(exchange, QUEUE)
        keys: list[str] = []
        while read and (message := await queue.get(fail=False)) is not None:
            await message.ack()
            keys.append(str(message.message_id))
        return keys
    finally:
        await connection.close()
