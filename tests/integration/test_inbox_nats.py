"""The JetStream inbox against a real nats-server: each message applied once, acknowledged after its commit.

Messages are published by outboxkit's own ``NatsTransport`` (the row's key as
``Nats-Msg-Id``); copies are published again after the stream's duplicate
window, as a sender retrying late does.  A failing handler is retried by
JetStream after the ``nak``'s delay, and stops at the consumer's
``max_deliver`` with JetStream's advisory, the message kept in the stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import nats
import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from outboxkit.inbox.nats import NatsInbox
from outboxkit.transports.nats import NatsTransport
from tests.support.brokers import NatsServer
from tests.support.inbox import applied, create_applied_table
from tests.support.inbox_brokers import SOURCE, Handler, Outage, counts, holds, send_all, wait_for

STREAM, DURABLE = "ORDERS", "billing"


@pytest.fixture
def server() -> Iterator[NatsServer]:
    with NatsServer() as started:
        assert isinstance(started, NatsServer)
        yield started


async def publish_late_copy(js, message_id: str) -> None:
    """A copy JetStream stores: published again until the stream's duplicate window (0.1 s) has passed."""
    body = json.dumps({"id": message_id}).encode()
    await wait_for(
        lambda: _stored(js, message_id, body), timeout=30, what=f"a copy of {message_id} stored past the duplicate window"
    )


async def _stored(js, message_id: str, body: bytes) -> bool:
    ack = await js.publish("orders.created", body, headers={"Nats-Msg-Id": message_id})
    return not ack.duplicate


async def consume(server: NatsServer, engine, handler: Handler, *, publish, settled, max_deliver: int = 5) -> list[dict]:
    """Subscribe a ``NatsInbox`` (nak delay 0.05 s), run ``publish(js)``, wait for ``settled(js, advisories)``."""
    client = await nats.connect(server.url)
    advisories: list[dict] = []
    try:
        js = client.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["orders.>"], duplicate_window=0.1))

        async def note(msg) -> None:
            advisories.append(json.loads(msg.data))

        await client.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{DURABLE}", cb=note)
        await publish(js)
        inbox = NatsInbox(engine, source=SOURCE, handler=handler, retry_delay_seconds=0.05)
        await js.subscribe(
            "orders.>", durable=DURABLE, cb=inbox.process, manual_ack=True,
            config=ConsumerConfig(max_deliver=max_deliver, ack_wait=30),
        )
        await wait_for(lambda: settled(js, advisories), what="every message settled")
    finally:
        await client.close()
    return advisories


async def all_acknowledged(js, advisories) -> bool:
    info = await js.consumer_info(STREAM, DURABLE)
    stream = await js.stream_info(STREAM)
    return info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq == stream.state.last_seq


def test_each_message_is_applied_once_though_late_copies_arrive(engine, server):
    create_applied_table(engine)
    ids = [f"order-{n}" for n in range(20)]
    transport = NatsTransport()

    async def publish(js) -> None:
        await asyncio.to_thread(send_all, transport, f"nats://127.0.0.1:{server.port}/orders.created", ids)
        for message_id in ids[:5]:
            await publish_late_copy(js, message_id)

    handler = Handler()
    try:
        asyncio.run(consume(server, engine, handler, publish=publish, settled=all_acknowledged))
    finally:
        transport.close()
    assert applied(engine) == {message_id: 1 for message_id in ids}
    assert sorted(handler.calls) == sorted(ids)  # the copies never reached the handler
    assert counts(engine) == (5, 0)


def test_a_failing_handler_rolls_back_and_the_redelivery_applies_it(engine, server):
    create_applied_table(engine)
    handler = Handler(failing={"order-1": 2})

    async def publish(js) -> None:
        for message_id in ("order-0", "order-1"):
            await js.publish("orders.created", json.dumps({"id": message_id}).encode(), headers={"Nats-Msg-Id": message_id})

    asyncio.run(consume(server, engine, handler, publish=publish, settled=all_acknowledged))
    assert applied(engine) == {"order-0": 1, "order-1": 1}
    assert handler.calls.count("order-1") == 3
    assert counts(engine) == (0, 2)


def test_a_message_that_always_fails_stops_at_max_deliver_and_stays_in_the_stream(engine, server):
    create_applied_table(engine)
    handler = Handler(failing={"poison": None})

    async def publish(js) -> None:
        await js.publish("orders.created", json.dumps({"id": "poison"}).encode(), headers={"Nats-Msg-Id": "poison"})
        await js.publish("orders.created", b'{"id": "no id"}')  # no Nats-Msg-Id: its copies cannot be told apart
        await js.publish("orders.created", json.dumps({"id": "order-0"}).encode(), headers={"Nats-Msg-Id": "order-0"})

    async def both_given_up(js, advisories) -> bool:
        return len(advisories) == 2 and await all_acknowledged(js, advisories) is False and len(applied(engine)) == 1

    advisories = asyncio.run(consume(server, engine, handler, publish=publish, settled=both_given_up, max_deliver=3))
    assert sorted(advisory["stream_seq"] for advisory in advisories) == [1, 2]
    assert all(advisory["deliveries"] == 3 for advisory in advisories)
    assert applied(engine) == {"order-0": 1}
    assert handler.calls.count("poison") == 3
    assert counts(engine) == (0, 6)  # three failures of each; nothing was applied

    async def still_stored() -> int:
        client = await nats.connect(server.url)
        try:
            return (await client.jetstream().stream_info(STREAM)).state.messages
        finally:
            await client.close()

    assert asyncio.run(still_stored()) == 3


class FailureCount:
    def __init__(self) -> None:
        self.failed = 0

    def message_handled(self, source: str) -> None:
        pass

    def duplicate_dropped(self, source: str) -> None:
        pass

    def handler_failed(self, source: str) -> None:
        self.failed += 1


def test_a_database_outage_keeps_the_messages_instead_of_spending_their_deliveries(engine, server, database_url, caplog):
    create_applied_table(engine)
    outage = Outage(database_url)
    failures = FailureCount()
    ids = ["order-0", "order-1", "order-2"]

    async def run() -> list[dict]:
        client = await nats.connect(server.url)
        advisories: list[dict] = []
        try:
            js = client.jetstream()
            await js.add_stream(StreamConfig(name=STREAM, subjects=["orders.>"]))

            async def note(msg) -> None:
                advisories.append(json.loads(msg.data))

            await client.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.{DURABLE}", cb=note)
            for message_id in ids:
                await js.publish("orders.created", json.dumps({"id": message_id}).encode(), headers={"Nats-Msg-Id": message_id})
            outage.begin()
            inbox = NatsInbox(engine, source=SOURCE, handler=Handler(), retry_delay_seconds=0.05, observers=[failures])
            # Two deliveries at most, and an ack_wait shorter than the outage: without the keeping, the outage would
            # spend both deliveries of each message (dead letters) or let ack_wait run out (redeliveries).
            subscription = await js.pull_subscribe(
                "orders.>", durable=DURABLE, config=ConsumerConfig(max_deliver=2, ack_wait=3)
            )
            stop = asyncio.Event()
            running = asyncio.create_task(inbox.run(subscription, stop, wait_seconds=0.2))
            try:
                await wait_for(lambda: holds(failures.failed >= 1), what="the first message failing on the outage")
                await asyncio.sleep(4)  # the outage itself: longer than ack_wait, many times the nak delay
                outage.end()
                await wait_for(lambda: holds(len(applied(engine)) == len(ids)), what="every message applied after the outage")
                await wait_for(lambda: all_acknowledged(js, advisories), what="every message acknowledged")
            finally:
                stop.set()
                await running
            info = await js.consumer_info(STREAM, DURABLE)
            assert info.num_redelivered == 0
        finally:
            await client.close()
        return advisories

    try:
        advisories = asyncio.run(run())
    finally:
        outage.close()
    assert advisories == []
    assert applied(engine) == {message_id: 1 for message_id in ids}
    assert failures.failed == 1  # the message in hand when the outage began; kept with those fetched with it
    assert "the database does not answer; message order-0 is kept" in caplog.text
