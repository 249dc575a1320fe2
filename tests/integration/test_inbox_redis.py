"""The Redis Streams inbox against a real redis-server: each entry applied once, acknowledged after its commit.

Entries are appended by outboxkit's own ``RedisStreamsTransport`` (the row's
key in the ``idempotency_key`` field); Redis keeps copies, which the inbox
drops.  An entry whose handler fails stays pending and is taken back after
``retry_after_seconds``; one delivered ``max_deliveries`` times goes to the
dead-letter stream, acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio

from outboxkit.inbox.redis_streams import RedisStreamsInbox
from outboxkit.transports.redis_streams import RedisStreamsTransport
from tests.support.brokers import RedisServer, free_port
from tests.support.inbox import applied, create_applied_table
from tests.support.inbox_brokers import SOURCE, Handler, counts, holds, send_all, wait_for

STREAM, GROUP = "orders", "billing"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        assert isinstance(started, RedisServer)
        yield started


def send(server: RedisServer, ids: list[str]) -> None:
    transport = RedisStreamsTransport()
    try:
        send_all(transport, f"{server.url}/0/{STREAM}", ids)
    finally:
        transport.close()


async def consume(
    server: RedisServer, engine, handler: Handler, *, settled, consumers: int = 1, decode: bool = False,
    retry_after: float = 0.05,
) -> dict:
    """``consumers`` inboxes of one group polling until ``settled(client)``; the dead-letter stream's entries."""
    client = redis.asyncio.Redis.from_url(f"{server.url}/0", decode_responses=decode)
    try:
        inboxes = [
            RedisStreamsInbox(
                engine, source=SOURCE, handler=handler, client=client, stream=STREAM, group=GROUP,
                consumer=f"consumer-{n}", max_deliveries=3, retry_after_seconds=retry_after,
            )
            for n in range(consumers)
        ]
        await inboxes[0].create_group()
        await inboxes[0].create_group()  # a second create finds the group and leaves it
        stop = asyncio.Event()
        runs = [asyncio.create_task(inbox.run(stop, count=5, block_seconds=0.05)) for inbox in inboxes]
        try:
            await wait_for(lambda: settled(client), what="every entry settled")
        finally:
            stop.set()
            await asyncio.gather(*runs)
        return {entry_id: fields for entry_id, fields in await client.xrange(f"{STREAM}.dead")}
    finally:
        await client.aclose()


async def nothing_pending(client) -> bool:
    summary = await client.xpending(STREAM, GROUP)
    groups = await client.xinfo_groups(STREAM)
    last = (await client.xinfo_stream(STREAM))["last-generated-id"]
    return summary["pending"] == 0 and groups[0]["last-delivered-id"] == last


def test_each_entry_is_applied_once_though_copies_are_in_the_stream(engine, server):
    create_applied_table(engine)
    ids = [f"order-{n}" for n in range(20)]
    send(server, ids)
    send(server, ids[:5])  # retried sends: Redis keeps both copies
    handler = Handler()
    dead = asyncio.run(consume(server, engine, handler, settled=nothing_pending, consumers=2, retry_after=60))
    assert applied(engine) == {message_id: 1 for message_id in ids}
    assert sorted(handler.calls) == sorted(ids)
    assert counts(engine) == (5, 0)
    assert dead == {}


def test_a_failing_handler_leaves_the_entry_pending_and_it_is_taken_back_and_applied(engine, server):
    create_applied_table(engine)
    send(server, ["order-0", "order-1"])
    handler = Handler(failing={"order-1": 2})
    asyncio.run(consume(server, engine, handler, settled=nothing_pending, decode=True))
    assert applied(engine) == {"order-0": 1, "order-1": 1}
    assert handler.calls.count("order-1") == 3
    assert counts(engine) == (0, 2)


def test_an_entry_that_always_fails_is_moved_to_the_dead_letter_stream_after_max_deliveries(engine, server):
    create_applied_table(engine)
    send(server, ["poison", "order-0"])

    async def add_one_without_id() -> None:
        client = redis.asyncio.Redis.from_url(f"{server.url}/0")
        try:
            await client.xadd(STREAM, {"body": b'{"id": "no id"}'})
        finally:
            await client.aclose()

    asyncio.run(add_one_without_id())
    handler = Handler(failing={"poison": None})
    dead = asyncio.run(consume(server, engine, handler, settled=nothing_pending))
    assert applied(engine) == {"order-0": 1}
    assert handler.calls.count("poison") == 3
    assert sorted(fields.get(b"idempotency_key", b"-") for fields in dead.values()) == [b"-", b"poison"]
    assert {fields[b"dead_letter_deliveries"] for fields in dead.values()} == {b"3"}
    assert counts(engine) == (0, 8)  # three failures and the dead letter, for each of the two


def test_the_consumer_keeps_running_through_a_redis_that_goes_away_and_comes_back(engine, caplog):
    create_applied_table(engine)
    port = free_port()
    first = RedisServer(port=port)
    first.start()
    second = RedisServer(port=port)
    try:
        send(first, ["order-0"])

        async def run() -> None:
            client = redis.asyncio.Redis.from_url(f"{first.url}/0")
            inbox = RedisStreamsInbox(
                engine, source=SOURCE, handler=Handler(), client=client, stream=STREAM, group=GROUP, consumer="one"
            )
            await inbox.create_group()
            stop = asyncio.Event()
            running = asyncio.create_task(inbox.run(stop, block_seconds=0.1))
            try:
                await wait_for(lambda: holds("order-0" in applied(engine)), what="order-0 applied")
                await asyncio.to_thread(first.close)
                await wait_for(lambda: holds("reading the stream orders failed" in caplog.text), what="the failure logged")
                await asyncio.to_thread(second.start)  # without persistence: the group is made again, as after a loss
                await inbox.create_group()
                await asyncio.to_thread(send, second, ["order-1"])
                await wait_for(lambda: holds("order-1" in applied(engine)), what="order-1 applied after the restart")
                assert not running.done()
            finally:
                stop.set()
                await running
                await client.aclose()

        asyncio.run(run())
    finally:
        first.close()
        second.close()
    assert applied(engine) == {"order-0": 1, "order-1": 1}
