"""NATS JetStream delivery against a real nats-server (tests/support/brokers.py), through the real drain.

Every row is accepted only on JetStream's acknowledgement; the row's
idempotency key is the message's ``Nats-Msg-Id``, so a second send of the same
row is dropped by the stream; a broker that is down or does not answer leaves
the row to be retried, nothing lost; a message JetStream will never take
(too large, no stream for the subject) is stuck with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig
from sqlalchemy import Engine

from outboxkit import Drainer
from outboxkit.policy import FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.nats import NatsTransport
from tests.support.brokers import NatsServer, broker_drainer, drain_once_through, free_port, insert_rows

STREAM = "ORDERS"


def add_stream(server: NatsServer, **config: Any) -> None:
    async def add() -> None:
        user, password = server.credentials or (None, None)
        client = await nats.connect(server.url, user=user, password=password)
        try:
            await client.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["orders.>"], **config))
        finally:
            await client.close()

    asyncio.run(add())


def stored_messages(server: NatsServer) -> list[tuple[dict[str, str], bytes]]:
    """Every message of the stream, in order: (headers, payload)."""

    async def read() -> list[tuple[dict[str, str], bytes]]:
        user, password = server.credentials or (None, None)
        client = await nats.connect(server.url, user=user, password=password)
        try:
            stream = client.jetstream()
            info = await stream.stream_info(STREAM)
            messages = []
            for sequence in range(info.state.first_seq, info.state.last_seq + 1):
                message = await stream.get_msg(STREAM, sequence)
                messages.append((dict(message.headers or {}), message.data or b""))
            return messages
        finally:
            await client.close()

    return asyncio.run(read())


@pytest.fixture
def server() -> Iterator[NatsServer]:
    with NatsServer() as started:
        assert isinstance(started, NatsServer)
        yield started


@pytest.fixture
def transport() -> Iterator[NatsTransport]:
    made = NatsTransport()
    yield made
    made.close()


@pytest.fixture
def drainer(engine: Engine, clock, transport: NatsTransport) -> Iterator[Drainer]:
    with broker_drainer(engine, clock, transport) as made:
        yield made


def test_rows_are_published_and_done_on_the_streams_acknowledgement(server, drainer, engine, read_events):
    add_stream(server)
    ids = insert_rows(engine, f"{server.url}/orders.created", [{"n": n} for n in range(5)])

    result = drainer.drain_once()

    assert (result.delivered, result.retried, result.stuck) == (5, 0, 0)
    rows = read_events()
    assert all(rows[row_id].status == "done" and rows[row_id].last_error is None for row_id in ids)
    messages = stored_messages(server)
    assert sorted(json.loads(body)["n"] for _, body in messages) == list(range(5))
    assert {headers["Nats-Msg-Id"] for headers, _ in messages} == {str(rows[row_id].idempotency_key) for row_id in ids}
    assert all(headers["X-Kind"] == "event" for headers, _ in messages)


def test_the_idempotency_key_is_the_de_duplication_id(server, transport):
    add_stream(server)
    delivery = Delivery(url=f"{server.url}/orders.created", json={"n": 1}, key="customer-7")

    first = transport.send(delivery, idempotency_key="row-key-1", timeout=5)
    second = transport.send(delivery, idempotency_key="row-key-1", timeout=5)

    assert first.acknowledgement == f"stream {STREAM} seq 1"
    assert second.succeeded and "duplicate" in (second.acknowledgement or "")
    [(headers, body)] = stored_messages(server)
    assert (headers["Nats-Msg-Id"], headers["Outboxkit-Key"], body) == ("row-key-1", "customer-7", b'{"n":1}')


def test_a_broker_down_at_start_is_retried_and_nothing_is_lost(engine, drainer, clock, read_events):
    port = free_port()
    [row_id] = insert_rows(engine, f"nats://127.0.0.1:{port}/orders.created", [{"n": 1}])

    first = drainer.drain_once()

    row = read_events()[row_id]
    assert (first.retried, row.status, row.attempts) == (1, "pending", 1)
    assert row.last_error.startswith("connection:")
    with NatsServer(port=port) as server:
        assert isinstance(server, NatsServer)
        add_stream(server)
        clock.advance(seconds=1)
        assert drainer.drain_once().delivered == 1
        assert read_events()[row_id].status == "done"
        assert len(stored_messages(server)) == 1


def test_a_subject_no_stream_takes_is_stuck_with_the_reason(server, drainer, engine, read_events):
    add_stream(server)
    [row_id] = insert_rows(engine, f"{server.url}/invoices.created", [{"n": 1}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck" and row.attempts == 1
    assert "no JetStream stream takes the subject 'invoices.created'" in row.last_error


def test_a_message_over_the_streams_size_limit_is_stuck_with_the_reason(server, drainer, engine, read_events):
    add_stream(server, max_msg_size=1024)
    [row_id] = insert_rows(engine, f"{server.url}/orders.created", [{"text": "x" * 2000}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck"
    assert row.last_error.startswith("rejected: JetStream answered 400") and "maximum" in row.last_error


def test_a_message_over_the_servers_max_payload_is_stuck_with_the_reason(engine, drainer, read_events):
    with NatsServer(max_payload=4096) as server:
        assert isinstance(server, NatsServer)
        add_stream(server)
        [row_id] = insert_rows(engine, f"{server.url}/orders.created", [{"text": "x" * 5000}])

        assert drainer.drain_once().stuck == 1

        row = read_events()[row_id]
        assert row.status == "stuck"
        assert "over the server's max_payload (4096 bytes)" in row.last_error


def test_a_broker_that_does_not_answer_by_the_deadline_is_a_timeout_and_the_retry_is_dropped_as_a_duplicate(
    server, drainer, transport, engine, clock, read_events
):
    add_stream(server)
    [row_id] = insert_rows(engine, f"{server.url}/orders.created", [{"n": 1}])
    transport.send(Delivery(url=f"{server.url}/orders.warm"), idempotency_key="warm", timeout=5)  # connected
    server.pause()
    try:
        result = drainer.drain_once()
    finally:
        server.resume()

    row = read_events()[row_id]
    assert (result.retried, row.status) == (1, "pending")
    assert row.last_error.startswith("timeout: no JetStream acknowledgement within")
    clock.advance(seconds=1)
    assert drainer.drain_once().delivered == 1
    # The paused server may have stored the first copy after all: the retry carried the same id.
    assert [json.loads(body) for _, body in stored_messages(server) if body] == [{"n": 1}]


def test_a_delivery_of_another_scheme_is_refused_before_sending(transport):
    result = transport.send(Delivery(url="redis://127.0.0.1:1/0/orders"), idempotency_key="k", timeout=1)
    assert result.failure is FailureKind.REFUSED


def test_credentials_the_server_refuses_are_retried_and_the_row_goes_once_they_are_right(engine, clock, read_events):
    # Credentials are the transport's, not the message's: retried (the breaker holds the rows), never stuck.
    with NatsServer(user="outboxkit", password="right") as server:
        assert isinstance(server, NatsServer)
        add_stream(server)
        [row_id] = insert_rows(engine, f"{server.url}/orders.created", [{"n": 1}])
        assert drain_once_through(engine, clock, NatsTransport(user="outboxkit", password="wrong")).retried == 1
        row = read_events()[row_id]
        assert row.status == "pending" and row.last_error.startswith("connection:")
        assert "authorization" in row.last_error.lower()
        clock.advance(seconds=1)
        assert drain_once_through(engine, clock, NatsTransport(user="outboxkit", password="right")).delivered == 1
        assert len(stored_messages(server)) == 1
