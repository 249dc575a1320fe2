"""Amazon SQS delivery against moto's stand-alone server (AWS's API as moto implements it, not AWS), through the drain.

A row is done on the ``MessageId`` SQS answers; on a FIFO queue the idempotency key is the
``MessageDeduplicationId`` (SQS drops a second copy) and the delivery's key the ``MessageGroupId``; a missing
queue, and before sending a message over the size limit or a FIFO delivery without a key, are stuck with the
reason; a server that is down leaves the row to be retried, nothing lost.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, insert

from outboxkit import Delivery, Drainer
from outboxkit.transports.sqs import SqsTransport
from tests.support.brokers import SqsServer, free_port
from tests.support.models import SampleEvent

REGION = "eu-west-1"
ACCOUNT = "123456789012"  # moto's account


@pytest.fixture(scope="module")
def server() -> Iterator[SqsServer]:
    with SqsServer() as started:
        assert isinstance(started, SqsServer)
        yield started


def sqs(server: SqsServer) -> Any:
    return boto3.client("sqs", region_name=REGION, endpoint_url=f"http://{server.endpoint}",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def make_queue(server: SqsServer, name: str) -> str:
    attributes = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
    sqs(server).create_queue(QueueName=name, Attributes=attributes)
    return f"sqs://{server.endpoint}/{ACCOUNT}/{name}"


def received(server: SqsServer, url: str) -> list[dict[str, Any]]:
    """Every message in the queue, taken off it."""
    client, queue_url = sqs(server), "http://" + url.removeprefix("sqs://")
    messages: list[dict[str, Any]] = []
    while batch := client.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], AttributeNames=["All"]
    ).get("Messages", []):
        messages.extend(batch)
        for message in batch:
            client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return messages


@pytest.fixture
def transport() -> Iterator[SqsTransport]:
    made = SqsTransport(region=REGION, access_key_id="testing", secret_access_key="testing", endpoint_scheme="http")
    yield made
    made.close()


def drainer_of(engine: Engine, clock, transport: SqsTransport) -> Drainer:
    options = dataclasses.replace(SampleEvent.__outbox__, timeout=2.0)
    return Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options)


def insert_rows(engine: Engine, url: str, payloads: list[dict[str, Any]]) -> list[int]:
    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": url, "payload": payload} for payload in payloads]))


def test_rows_are_sent_and_done_on_the_message_id(server, transport, engine, clock, read_events):
    url = make_queue(server, "orders")
    ids = insert_rows(engine, url, [{"n": n} for n in range(6)])
    drainer = drainer_of(engine, clock, transport)
    try:
        result = drainer.drain_once()
    finally:
        drainer.close()

    assert (result.delivered, result.retried, result.stuck) == (6, 0, 0)
    rows = read_events()
    assert all(rows[row_id].status == "done" for row_id in ids)
    messages = received(server, url)
    assert sorted(json.loads(message["Body"])["n"] for message in messages) == list(range(6))
    keys = {str(rows[row_id].idempotency_key) for row_id in ids}
    assert {message["MessageAttributes"]["Outboxkit-Idempotency-Key"]["StringValue"] for message in messages} == keys


def test_a_fifo_queue_gets_the_key_as_message_group_and_the_idempotency_key_as_deduplication_id(server, transport):
    url = make_queue(server, "orders.fifo")
    for n in range(6):
        delivery = Delivery(url=url, json={"n": n}, key=f"g{n % 2}")
        assert transport.send(delivery, idempotency_key=f"key-{n}", timeout=5).succeeded

    messages = received(server, url)
    assert {message["Attributes"]["MessageDeduplicationId"] for message in messages} == {f"key-{n}" for n in range(6)}
    for group in ("g0", "g1"):
        in_group = [json.loads(message["Body"])["n"] for message in messages if message["Attributes"]["MessageGroupId"] == group]
        assert in_group == sorted(in_group) and len(in_group) == 3


def test_a_row_sent_twice_to_a_fifo_queue_is_stored_once(server, transport):
    url = make_queue(server, "twice.fifo")
    delivery = Delivery(url=url, json={"n": 1}, key="g")
    first = transport.send(delivery, idempotency_key="same-key", timeout=5)
    second = transport.send(delivery, idempotency_key="same-key", timeout=5)

    assert first.succeeded and second.succeeded
    assert len(received(server, url)) == 1


def test_a_standard_queue_carries_the_key_and_headers_as_attributes(server, transport):
    url = make_queue(server, "plain")
    result = transport.send(Delivery(url=url, json={"n": 1}, key="k1", headers={"X-Kind": "order"}), idempotency_key="i1",
                            timeout=5)

    assert result.succeeded and result.acknowledgement.startswith("queue plain message ")
    [message] = received(server, url)
    attributes = {name: value["StringValue"] for name, value in message["MessageAttributes"].items()}
    assert attributes == {"X-Kind": "order", "Outboxkit-Key": "k1", "Outboxkit-Idempotency-Key": "i1"}
    assert json.loads(message["Body"]) == {"n": 1}


def test_a_missing_queue_is_stuck_with_sqs_answer(server, transport, engine, clock, read_events):
    [row_id] = insert_rows(engine, f"sqs://{server.endpoint}/{ACCOUNT}/no-such-queue", [{"n": 1}])
    drainer = drainer_of(engine, clock, transport)
    try:
        assert drainer.drain_once().stuck == 1
    finally:
        drainer.close()
    row = read_events()[row_id]
    assert row.status == "stuck" and row.last_error.startswith("rejected: SQS answered")
    assert "NonExistentQueue" in row.last_error or "QueueDoesNotExist" in row.last_error


def test_a_message_over_the_limit_and_a_fifo_message_without_a_key_are_refused_before_sending(server):
    url = make_queue(server, "limits.fifo")
    small = SqsTransport(region=REGION, access_key_id="testing", secret_access_key="testing", endpoint_scheme="http",
                         max_message_size=1024)
    try:
        big = small.send(Delivery(url=url, json={"x": "y" * 1024}, key="g"), idempotency_key="big", timeout=5)
        keyless = small.send(Delivery(url=url, json={"n": 1}), idempotency_key="keyless", timeout=5)
    finally:
        small.close()

    assert big.error is not None and big.error.startswith("rejected before sending: the message (")
    assert "over max_message_size (1,024)" in big.error
    assert keyless.error == "refused before sending: the FIFO queue 'limits.fifo' needs a message group: give the Delivery a key"
    assert received(server, url) == []


def test_a_server_down_at_start_is_retried_and_nothing_is_lost(engine, clock, transport, read_events):
    port = free_port()
    [row_id] = insert_rows(engine, f"sqs://127.0.0.1:{port}/{ACCOUNT}/late", [{"n": 1}])
    drainer = drainer_of(engine, clock, transport)
    try:
        assert drainer.drain_once().retried == 1
        row = read_events()[row_id]
        assert (row.status, row.attempts) == ("pending", 1) and row.last_error.startswith("connection:")
        with SqsServer(port=port) as late:
            assert isinstance(late, SqsServer)
            url = make_queue(late, "late")
            clock.advance(seconds=1)
            assert drainer.drain_once().delivered == 1
            assert len(received(late, url)) == 1
    finally:
        drainer.close()
    assert read_events()[row_id].status == "done"
