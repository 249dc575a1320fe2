"""RabbitMQ delivery against a real RabbitMQ node of its own (tests/support/brokers.py), through the real drain.

A row is accepted only on the publisher confirm of a routed message (mandatory
routing); its ``message_id`` is the row's idempotency key; an unroutable
message, a missing exchange and a message over the broker's size limit are
stuck with the reason; a broker that is down or does not answer leaves the row
to be retried, nothing lost.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aio_pika
import pytest
from sqlalchemy import Engine

from outboxkit import Drainer
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.rabbitmq import RabbitMqTransport
from tests.support.brokers import RabbitMqServer, broker_drainer, drain_once_through, free_port, insert_rows

MAX_MESSAGE_SIZE = 4096


def bind_queue(url: str, queue: str) -> None:
    """A direct exchange ``orders`` and a durable queue ``queue`` bound to it under the routing key ``queue``."""

    async def declare() -> None:
        connection = await aio_pika.connect(f"{url}/%2F")
        try:
            channel = await connection.channel()
            exchange = await channel.declare_exchange("orders", aio_pika.ExchangeType.DIRECT)
            declared = await channel.declare_queue(queue, durable=True)
            await declared.bind(exchange, queue)
        finally:
            await connection.close()

    asyncio.run(declare())


def queued(url: str, queue: str) -> list[tuple[str | None, bytes]]:
    """Every message in ``queue`` (taken off it): (message_id, body)."""

    async def drain_queue() -> list[tuple[str | None, bytes]]:
        connection = await aio_pika.connect(f"{url}/%2F")
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(queue, durable=True)
            messages = []
            while (message := await declared.get(fail=False)) is not None:
                await message.ack()
                messages.append((message.message_id, message.body))
            return messages
        finally:
            await connection.close()

    return asyncio.run(drain_queue())


@pytest.fixture(scope="module")
def server() -> Iterator[RabbitMqServer]:
    with RabbitMqServer(max_message_size=MAX_MESSAGE_SIZE) as started:
        assert isinstance(started, RabbitMqServer)
        yield started


@pytest.fixture
def transport() -> Iterator[RabbitMqTransport]:
    made = RabbitMqTransport()
    yield made
    made.close()


@pytest.fixture
def drainer(engine: Engine, clock, transport: RabbitMqTransport) -> Iterator[Drainer]:
    with broker_drainer(engine, clock, transport) as made:
        yield made


def target(server: RabbitMqServer, routing_key: str, exchange: str = "orders") -> str:
    return f"{server.url}/%2F?exchange={exchange}&routing_key={routing_key}"


def test_rows_are_published_and_done_on_the_publisher_confirm(server, drainer, engine, read_events):
    bind_queue(server.url, "created")
    ids = insert_rows(engine, target(server, "created"), [{"n": n} for n in range(5)])

    result = drainer.drain_once()

    assert (result.delivered, result.retried, result.stuck) == (5, 0, 0)
    rows = read_events()
    messages = queued(server.url, "created")
    assert sorted(json.loads(body)["n"] for _, body in messages) == list(range(5))
    assert {message_id for message_id, _ in messages} == {str(rows[row_id].idempotency_key) for row_id in ids}


def test_an_unroutable_message_is_not_accepted_and_is_stuck_with_the_reason(server, drainer, engine, read_events):
    bind_queue(server.url, "created")
    [row_id] = insert_rows(engine, target(server, "nobody-listens"), [{"n": 1}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck" and row.attempts == 1
    assert row.last_error.startswith("rejected: unroutable: no queue is bound for routing key 'nobody-listens'")
    assert "NO_ROUTE" in row.last_error


def test_a_missing_exchange_is_stuck_and_the_next_row_goes_on_a_new_channel(server, drainer, engine, clock, read_events):
    bind_queue(server.url, "created")
    [missing] = insert_rows(engine, target(server, "created", exchange="no-such-exchange"), [{"n": 1}])
    assert drainer.drain_once().stuck == 1
    assert "NOT_FOUND - no exchange 'no-such-exchange'" in read_events()[missing].last_error

    [fine] = insert_rows(engine, target(server, "created"), [{"n": 2}])
    assert drainer.drain_once().delivered == 1
    assert read_events()[fine].status == "done"
    assert [json.loads(body) for _, body in queued(server.url, "created")] == [{"n": 2}]


def test_a_message_over_the_brokers_size_limit_is_stuck_with_the_reason(server, drainer, engine, read_events):
    bind_queue(server.url, "created")
    [row_id] = insert_rows(engine, target(server, "created"), [{"text": "x" * (MAX_MESSAGE_SIZE + 1)}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck"
    assert f"is larger than configured max size {MAX_MESSAGE_SIZE}" in row.last_error


def test_a_broker_that_does_not_answer_by_the_deadline_is_a_timeout_then_delivered(
    server, drainer, transport, engine, clock, read_events
):
    bind_queue(server.url, "created")
    queued(server.url, "created")  # empty it
    [row_id] = insert_rows(engine, target(server, "created"), [{"n": 1}])
    assert transport.send(Delivery(url=target(server, "created"), json={"warm": 1}), idempotency_key="warm", timeout=10).succeeded
    server.pause()
    try:
        result = drainer.drain_once()
    finally:
        server.resume()

    row = read_events()[row_id]
    assert (result.retried, row.status) == (1, "pending")
    assert row.last_error.startswith("timeout: no publisher confirm within")
    clock.advance(seconds=1)
    assert drainer.drain_once().delivered == 1
    # RabbitMQ does not de-duplicate: the paused broker may have kept the first copy, with the same message_id.
    key = str(read_events()[row_id].idempotency_key)
    assert {message_id for message_id, body in queued(server.url, "created") if json.loads(body) == {"n": 1}} == {key}


def test_a_broker_down_at_start_is_retried_and_nothing_is_lost(engine, drainer, clock, read_events):
    port = free_port()
    [row_id] = insert_rows(engine, f"amqp://127.0.0.1:{port}/%2F?exchange=orders&routing_key=created", [{"n": 1}])

    first = drainer.drain_once()

    row = read_events()[row_id]
    assert (first.retried, row.status, row.attempts) == (1, "pending", 1)
    assert row.last_error.startswith("connection:")
    with RabbitMqServer(port=port) as server:
        bind_queue(server.url, "created")
        clock.advance(seconds=1)
        assert drainer.drain_once().delivered == 1
        assert read_events()[row_id].status == "done"
        assert len(queued(server.url, "created")) == 1


def test_credentials_the_broker_refuses_are_retried_and_the_row_goes_once_they_are_right(server, engine, clock, read_events):
    # Credentials are the transport's, not the message's: retried (the breaker holds the rows), never stuck.
    bind_queue(server.url, "created")
    queued(server.url, "created")  # empty it
    [row_id] = insert_rows(engine, target(server, "created"), [{"n": 1}])
    assert drain_once_through(engine, clock, RabbitMqTransport(password="wrong")).retried == 1
    row = read_events()[row_id]
    assert row.status == "pending" and row.last_error.startswith("connection:")
    clock.advance(seconds=1)
    assert drain_once_through(engine, clock, RabbitMqTransport(password="guest")).delivered == 1
    assert len(queued(server.url, "created")) == 1


def test_after_the_broker_restarts_the_next_send_reconnects_and_nothing_raises(server, transport, engine, clock, read_events):
    # The client's connection object outlives the broker it spoke to: opening a channel on it raised a RuntimeError
    # out of send() ("... closed"), every time, so the rows were never sent again after a restart.
    bind_queue(server.url, "created")
    queued(server.url, "created")  # empty it
    assert transport.send(Delivery(url=target(server, "created"), json={"warm": 1}), idempotency_key="warm", timeout=10).succeeded
    server.stop()
    server.start()
    bind_queue(server.url, "created")  # the exchange is not durable
    [row_id] = insert_rows(engine, target(server, "created"), [{"n": 1}])

    with broker_drainer(engine, clock, transport) as drainer:
        first = drainer.drain_once()
        if first.retried:  # the send that found the old connection dead may fail; the one after goes
            clock.advance(seconds=1)
            assert drainer.drain_once().delivered == 1

    row = read_events()[row_id]
    assert row.status == "done"
    assert row.last_error is None or row.last_error.startswith("connection:")
    # The persistent message sent before the restart is still queued beside the new one.
    assert [json.loads(body) for _, body in queued(server.url, "created")] == [{"warm": 1}, {"n": 1}]


def send_together(transport: RabbitMqTransport, url: str, bodies: list[dict[str, str]]) -> list[AttemptResult]:
    """Each body sent from a thread of its own, all at once, as the drain's send threads do."""
    deliveries = [Delivery(url=url, json=body) for body in bodies]
    with ThreadPoolExecutor(len(deliveries)) as pool:
        return list(pool.map(lambda pair: transport.send(pair[1], idempotency_key=f"k{pair[0]}", timeout=10),
                             enumerate(deliveries)))


def test_a_message_over_the_limit_given_is_refused_before_it_is_sent_and_its_neighbours_go(server):
    # Sent, it would make RabbitMQ close the channel the batch shares, while the client may still be writing it.
    bind_queue(server.url, "created")
    queued(server.url, "created")  # empty it
    transport = RabbitMqTransport(max_message_size=MAX_MESSAGE_SIZE)
    try:
        for _ in range(3):
            results = send_together(transport, target(server, "created"), [{"x": "y" * MAX_MESSAGE_SIZE}, {"n": "1"}] * 6)
            big, small = results[::2], results[1::2]
            assert {result.failure for result in big} == {FailureKind.REJECTED}
            assert all("is larger than the max_message_size" in (result.error or "") for result in big)
            assert all(result.succeeded for result in small), [result.error for result in small]
    finally:
        transport.close()
    assert len(queued(server.url, "created")) == 18


def test_a_message_sent_beside_one_the_broker_refuses_is_retried_not_stuck(server):
    # The limit unknown to the transport: the broker's 406 closes the shared channel, and the sends in flight on it
    # fail with that 406 too. Only the message it names (by its size) is refused for good.
    bind_queue(server.url, "created")
    transport = RabbitMqTransport(max_message_size=None)
    try:
        for _ in range(3):
            results = send_together(transport, target(server, "created"), [{"x": "y" * MAX_MESSAGE_SIZE}, {"n": "1"}] * 6)
            small = results[1::2]
            assert FailureKind.REJECTED not in {result.failure for result in small}, [result.error for result in small]
    finally:
        transport.close()
    queued(server.url, "created")
