"""Kafka delivery against a real Kafka-protocol broker (Tansu, tests/support/brokers.py), through the real drain.

Every row is accepted only on the broker's acknowledgement (the delivery report of an idempotent producer with
``acks=all``); its key is the message key, its headers and its idempotency key are the message's headers; one key's
rows land in one partition in order; a broker that is down, or stopped mid-run and started again, leaves the rows to
be retried, nothing lost; a topic the cluster does not have is stuck with the reason.

The messages are read back by a consumer assigned to every partition from the start (Tansu's consumer groups did
not answer a join within seconds here, so no test depends on them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from outboxkit import Drainer
from outboxkit.policy import FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.kafka import KafkaTransport
from tests.support.brokers import KafkaServer, broker_drainer, free_port, insert_rows
from tests.support.models import OrderedEvent

TOPIC = "orders"


def create_topic(server: KafkaServer, name: str = TOPIC, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(10)


def read_topic(server: KafkaServer, count: int, name: str = TOPIC) -> list[Any]:
    """The ``count`` messages the topic holds (and no more), sorted by partition and offset.

    Read until ``count`` arrive, then one more short poll must find nothing.  (Tansu's high watermark of a
    partition counts a produced batch, not its records, so the watermarks cannot say how many there are.)
    """
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "outboxkit-tests",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        partitions = sorted(consumer.list_topics(name, timeout=10).topics[name].partitions)
        consumer.assign([TopicPartition(name, partition, OFFSET_BEGINNING) for partition in partitions])
        messages: list[Any] = []
        deadline = time.monotonic() + 10
        while len(messages) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                messages.append(message)
        assert len(messages) == count, f"read {len(messages)} of {count} messages"
        assert consumer.poll(0.3) is None, "the topic holds more messages than were sent"
        return sorted(messages, key=lambda message: (message.partition(), message.offset()))
    finally:
        consumer.close()


def headers_of(message: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in message.headers() or []}


@pytest.fixture
def server() -> Iterator[KafkaServer]:
    with KafkaServer() as started:
        assert isinstance(started, KafkaServer)
        yield started


@pytest.fixture
def transport() -> Iterator[KafkaTransport]:
    made = KafkaTransport()
    yield made
    made.close()


@pytest.fixture
def drainer(engine: Engine, clock, transport: KafkaTransport) -> Iterator[Drainer]:
    with broker_drainer(engine, clock, transport) as made:
        yield made


def test_rows_are_produced_and_done_on_the_brokers_acknowledgement(server, drainer, engine, read_events):
    create_topic(server)
    ids = insert_rows(engine, f"{server.url}/{TOPIC}", [{"n": n} for n in range(5)])

    result = drainer.drain_once()

    assert (result.delivered, result.retried, result.stuck) == (5, 0, 0)
    rows = read_events()
    assert all(rows[row_id].status == "done" and rows[row_id].last_error is None for row_id in ids)
    messages = read_topic(server, 5)
    assert sorted(json.loads(message.value())["n"] for message in messages) == list(range(5))
    assert {headers_of(message)["Idempotency-Key"] for message in messages} == {
        str(rows[row_id].idempotency_key) for row_id in ids
    }
    assert all(headers_of(message)["X-Kind"] == "event" for message in messages)


def test_the_key_is_the_message_key_and_the_headers_are_the_messages(server, transport):
    create_topic(server)
    delivery = Delivery(url=f"{server.url}/{TOPIC}", json={"n": 1}, key="customer-7",
                        headers={"Event-Type": "order.created"})

    result = transport.send(delivery, idempotency_key="row-key-1", timeout=5)

    [message] = read_topic(server, 1)
    assert result.acknowledgement == f"topic {TOPIC} partition {message.partition()} offset {message.offset()}"
    assert (message.key(), message.value()) == (b"customer-7", b'{"n":1}')
    assert headers_of(message) == {"Event-Type": "order.created", "Idempotency-Key": "row-key-1"}


def test_one_keys_rows_land_in_one_partition_in_order(server, engine, clock, transport):
    create_topic(server, partitions=4)
    url = f"{server.url}/{TOPIC}"
    values = [{"target_url": url, "stream": stream, "payload": {"stream": stream, "n": n}}
              for n in range(4) for stream in ("a", "b", "c")]
    with engine.begin() as connection:
        connection.execute(insert(OrderedEvent), values)
    options = dataclasses.replace(OrderedEvent.__outbox__, timeout=1.0)
    drainer = Drainer(engine, OrderedEvent, transport=transport, clock=clock, options=options)
    try:
        for _ in range(10):  # one row per key in flight: a drain sends each key's next row
            drainer.drain_once()
            with Session(engine) as session:
                if all(row.status == "done" for row in session.scalars(select(OrderedEvent))):
                    break
    finally:
        drainer.close()

    by_key: dict[bytes, list[tuple[int, int]]] = {}
    for message in read_topic(server, 12):
        by_key.setdefault(message.key(), []).append((message.partition(), json.loads(message.value())["n"]))
    assert sorted(by_key) == [b"a", b"b", b"c"]
    for sent in by_key.values():
        assert len({partition for partition, _ in sent}) == 1
        assert [n for _, n in sent] == [0, 1, 2, 3]


def test_a_broker_down_at_start_is_retried_and_nothing_is_lost(engine, drainer, clock, read_events, caplog):
    port = free_port()
    [row_id] = insert_rows(engine, f"kafka://127.0.0.1:{port}/{TOPIC}", [{"n": 1}])

    with caplog.at_level(logging.DEBUG, logger="outboxkit.transports.kafka"):
        first = drainer.drain_once()

    row = read_events()[row_id]
    assert (first.retried, row.status, row.attempts) == (1, "pending", 1)
    assert row.last_error.startswith("connection:")
    # librdkafka's own lines (its failed connects) go to the module's logger, not straight to stderr.
    assert any(f"127.0.0.1:{port}" in record.getMessage() for record in caplog.records
               if record.name == "outboxkit.transports.kafka")
    with KafkaServer(port=port) as server:
        assert isinstance(server, KafkaServer)
        create_topic(server)
        clock.advance(seconds=1)
        assert drainer.drain_once().delivered == 1
        assert read_events()[row_id].status == "done"
        assert [json.loads(message.value()) for message in read_topic(server, 1)] == [{"n": 1}]


def test_a_broker_stopped_mid_run_leaves_rows_to_retry_and_they_go_when_it_is_back(
    server, engine, drainer, clock, read_events
):
    create_topic(server)
    url = f"{server.url}/{TOPIC}"
    insert_rows(engine, url, [{"n": 0}, {"n": 1}])
    assert drainer.drain_once().delivered == 2
    server.stop()
    ids = insert_rows(engine, url, [{"n": 2}, {"n": 3}, {"n": 4}])

    stopped = drainer.drain_once()

    rows = read_events()
    assert (stopped.delivered, stopped.retried) == (0, 3)
    assert all(rows[row_id].status == "pending" for row_id in ids)
    errors = [rows[row_id].last_error for row_id in ids]
    assert all(error.startswith(("timeout:", "connection:")) for error in errors), errors
    server.start()  # memory storage: the broker comes back empty, so the topic is made again
    create_topic(server)
    clock.advance(seconds=1)
    assert drainer.drain_once().delivered == 3
    rows = read_events()
    assert all(rows[row_id].status == "done" for row_id in ids)
    messages = read_topic(server, 3)
    assert sorted(json.loads(message.value())["n"] for message in messages) == [2, 3, 4]
    assert {headers_of(message)["Idempotency-Key"] for message in messages} == {
        str(rows[row_id].idempotency_key) for row_id in ids
    }


def test_a_topic_the_cluster_does_not_have_is_stuck_with_the_reason(server, drainer, engine, read_events):
    create_topic(server)
    [row_id] = insert_rows(engine, f"{server.url}/invoices", [{"n": 1}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck" and row.attempts == 1
    assert f"no topic 'invoices' on {server.bootstrap}" in row.last_error


def test_a_message_over_the_producers_size_limit_is_stuck_with_the_reason(server, engine, clock, read_events):
    create_topic(server)
    [row_id] = insert_rows(engine, f"{server.url}/{TOPIC}", [{"text": "x" * 5000}])
    transport = KafkaTransport(config={"message.max.bytes": 4096})
    try:
        with broker_drainer(engine, clock, transport) as drainer:
            assert drainer.drain_once().stuck == 1
    finally:
        transport.close()

    row = read_events()[row_id]
    assert row.status == "stuck"
    assert row.last_error.startswith("rejected:") and "too large" in row.last_error


def test_a_delivery_of_another_scheme_is_refused_before_sending(transport):
    result = transport.send(Delivery(url="nats://127.0.0.1:1/orders"), idempotency_key="k", timeout=1)
    assert result.failure is FailureKind.REFUSED
