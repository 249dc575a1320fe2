"""The RabbitMQ inbox against a real RabbitMQ node: each message applied once, acknowledged after its commit.

Messages are published by outboxkit's own ``RabbitMqTransport`` (the row's key
as ``message_id``); RabbitMQ keeps copies, which the inbox drops.  A failing
handler's message is returned to its queue; a quorum queue's
``x-delivery-limit`` dead-letters one that always fails.  One node serves the
module's tests (it takes seconds to boot); each test has its own queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aio_pika
import pytest

from outboxkit.inbox.rabbitmq import RabbitMqInbox
from outboxkit.transports.rabbitmq import RabbitMqTransport
from tests.support.brokers import RabbitMqServer
from tests.support.inbox import applied, create_applied_table
from tests.support.inbox_brokers import SOURCE, Handler, counts, send_all, wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[RabbitMqServer]:
    with RabbitMqServer() as started:
        assert isinstance(started, RabbitMqServer)
        yield started


@pytest.fixture
def queue(request) -> str:
    return request.node.name[len("test_"):][:40]


async def declare(channel, queue: str) -> tuple[object, object]:
    """A quorum queue that dead-letters a message after 2 returns (3 deliveries), and the queue of its dead letters."""
    dead = await channel.declare_queue(f"{queue}.dead", durable=True)
    exchange = await channel.declare_exchange(f"{queue}.dead", aio_pika.ExchangeType.FANOUT, durable=True)
    await dead.bind(exchange)
    main = await channel.declare_queue(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": f"{queue}.dead",
    })
    return main, dead


def setup(server: RabbitMqServer, queue: str) -> None:
    async def run() -> None:
        connection = await aio_pika.connect(server.url)
        async with connection:
            await declare(await connection.channel(), queue)

    asyncio.run(run())


def send(server: RabbitMqServer, queue: str, ids: list[str]) -> None:
    transport = RabbitMqTransport()
    try:
        send_all(transport, f"{server.url}/%2F?routing_key={queue}", ids)
    finally:
        transport.close()


async def consume(server: RabbitMqServer, engine, queue: str, handler: Handler, *, settled) -> list[str | None]:
    """A ``RabbitMqInbox`` on ``queue`` until ``settled(main, dead)``; the ids of the dead letters."""
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        main, dead = await declare(channel, queue)
        inbox = RabbitMqInbox(engine, source=SOURCE, handler=handler, retry_delay_seconds=0.05)
        tag = await main.consume(inbox.process)
        await wait_for(lambda: settled(main, dead), what="every message settled")
        await main.cancel(tag)
        letters = []
        while (letter := await dead.get(fail=False)) is not None:
            letters.append(letter.message_id)
            await letter.ack()
        return letters


def applied_all(engine, ids: list[str]):
    async def settled(main, dead) -> bool:
        declared = await main.declare()
        return declared.message_count == 0 and set(applied(engine)) == set(ids)

    return settled


def test_each_message_is_applied_once_though_copies_are_in_the_queue(engine, server, queue):
    create_applied_table(engine)
    setup(server, queue)
    ids = [f"order-{n}" for n in range(20)]
    send(server, queue, ids)
    send(server, queue, ids[:5])  # retried sends: RabbitMQ keeps both copies
    handler = Handler()

    async def every_copy_settled(main, dead) -> bool:
        return await applied_all(engine, ids)(main, dead) and counts(engine)[0] == 5

    assert asyncio.run(consume(server, engine, queue, handler, settled=every_copy_settled)) == []
    assert applied(engine) == {message_id: 1 for message_id in ids}
    assert sorted(handler.calls) == sorted(ids)
    assert counts(engine) == (5, 0)


def test_a_failing_handler_returns_the_message_and_the_redelivery_applies_it(engine, server, queue):
    create_applied_table(engine)
    setup(server, queue)
    send(server, queue, ["order-0", "order-1"])
    handler = Handler(failing={"order-1": 1})
    assert asyncio.run(consume(server, engine, queue, handler, settled=applied_all(engine, ["order-0", "order-1"]))) == []
    assert applied(engine) == {"order-0": 1, "order-1": 1}
    assert handler.calls.count("order-1") == 2
    assert counts(engine) == (0, 1)


def test_a_message_that_always_fails_is_dead_lettered_at_the_queues_delivery_limit(engine, server, queue):
    create_applied_table(engine)
    setup(server, queue)
    send(server, queue, ["poison", "order-0"])
    handler = Handler(failing={"poison": None})

    async def dead_lettered(main, dead) -> bool:
        declared = await dead.declare()
        return declared.message_count == 1 and set(applied(engine)) == {"order-0"}

    assert asyncio.run(consume(server, engine, queue, handler, settled=dead_lettered)) == ["poison"]
    assert applied(engine) == {"order-0": 1}
    assert handler.calls.count("poison") == 3
    assert counts(engine) == (0, 3)
