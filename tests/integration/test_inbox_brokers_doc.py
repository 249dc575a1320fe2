"""docs/inbox.md's broker consumers, run as written against real brokers: each order credited once.

Each page consumer is imported from the page's files, given a broker started by
the test, and run until the orders published by outboxkit's own transport are
credited; copies of them (a retried send) are dropped, and the source counts
them as duplicates.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text

from outboxkit.transports.base import Transport
from tests.support.brokers import NatsServer, RabbitMqServer, RedisServer
from tests.support.database import sqlalchemy_url
from tests.support.doc_pages import PAGE_RECEIVER_URL, create_schema, forget_package, page_files, write_package
from tests.support.inbox_brokers import holds, wait_for

ORDERS = {f"order-{n}": {"account": "acme", "amount": n + 1} for n in range(5)}
COPIES = ["order-0", "order-3"]


def send_orders(transport: Transport, url: str, ids: list[str]) -> None:
    from outboxkit.transports.base import Delivery

    try:
        for message_id in ids:
            result = transport.send(Delivery(url=url, json=ORDERS[message_id]), idempotency_key=message_id, timeout=10.0)
            assert result.acknowledgement is not None, result.error
    finally:
        transport.close()


def publish_nats(server: NatsServer) -> None:
    import nats
    from nats.js.api import StreamConfig

    from outboxkit.transports.nats import NatsTransport

    async def add_stream() -> None:
        client = await nats.connect(server.url)
        try:
            await client.jetstream().add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"], duplicate_window=0.1))
        finally:
            await client.close()

    asyncio.run(add_stream())
    send_orders(NatsTransport(), f"{server.url}/orders.created", list(ORDERS))


async def nats_copies(server: NatsServer) -> None:
    """Copies JetStream stores: sent again once the stream's duplicate window (0.1 s) has passed."""
    import nats

    client = await nats.connect(server.url)
    try:
        js = client.jetstream()
        for message_id in COPIES:
            body = json.dumps(ORDERS[message_id]).encode()

            async def stored(message_id: str = message_id, body: bytes = body) -> bool:
                ack = await js.publish("orders.created", body, headers={"Nats-Msg-Id": message_id})
                return not ack.duplicate

            await wait_for(stored, timeout=30, what=f"a copy of {message_id} stored")
    finally:
        await client.close()


def publish_rabbitmq(server: RabbitMqServer) -> None:
    import aio_pika

    from outboxkit.transports.rabbitmq import RabbitMqTransport

    async def declare() -> None:  # as the page's consumer declares it, so the orders wait for it
        connection = await aio_pika.connect(server.url)
        async with connection:
            await (await connection.channel()).declare_queue("orders", durable=True, arguments={
                "x-queue-type": "quorum", "x-delivery-limit": 5, "x-dead-letter-exchange": "orders.dead",
            })

    asyncio.run(declare())
    send_orders(RabbitMqTransport(), f"{server.url}/%2F?routing_key=orders", [*ORDERS, *COPIES])


def publish_redis(server: RedisServer) -> None:
    from outboxkit.transports.redis_streams import RedisStreamsTransport

    send_orders(RedisStreamsTransport(), f"{server.url}/0/orders", [*ORDERS, *COPIES])


async def no_copies(server: object) -> None:
    return None


BROKERS: dict[str, tuple[Callable[[], object], str, str, Callable[..., None], Callable[..., object]]] = {
    "nats": (NatsServer, "NATS_URL", "myinbox.nats_consumer", publish_nats, nats_copies),
    "rabbitmq": (RabbitMqServer, "RABBITMQ_URL", "myinbox.rabbitmq_consumer", publish_rabbitmq, no_copies),
    "redis": (RedisServer, "REDIS_URL", "myinbox.redis_consumer", publish_redis, no_copies),
}


@pytest.fixture(params=list(BROKERS))
def page_consumer(request, tmp_path, monkeypatch, database_url) -> Iterator[tuple[object, object, object, Callable]]:
    make_server, variable, module, publish, copies = BROKERS[request.param]
    write_package(tmp_path, page_files("inbox.md"), receiver_url=PAGE_RECEIVER_URL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))
    engine = create_engine(sqlalchemy_url(database_url))
    create_schema(engine, importlib.import_module("myinbox.models").Base.metadata, [])
    try:
        with make_server() as server:
            monkeypatch.setenv(variable, server.url)
            consumer = importlib.import_module(module)
            publish(server)
            yield server, engine, consumer, copies
            consumer.engine.dispose()
    finally:
        engine.dispose()
        forget_package("myinbox")
        assert "myinbox" not in sys.modules


def test_the_pages_consumer_credits_each_order_once(page_consumer):
    server, engine, consumer, copies = page_consumer

    def credited() -> list[tuple[str, int]]:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text("SELECT account, amount FROM credits ORDER BY amount"))]

    def duplicates() -> int:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT coalesce(sum(duplicates), 0) FROM outboxkit_inbox_sources WHERE source = 'orders'")
            ).scalar_one()

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.consume(stop))
        try:
            await wait_for(lambda: holds(len(credited()) == len(ORDERS)), what="every order credited")
            await copies(server)
            await wait_for(lambda: holds(duplicates() == len(COPIES)), what="the copies dropped")
        finally:
            stop.set()
            await task

    asyncio.run(run())
    assert credited() == [("acme", order["amount"]) for order in ORDERS.values()]
