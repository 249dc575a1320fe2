"""Redis Streams delivery against a real redis-server (tests/support/brokers.py), through the real drain.

A row is accepted only on the entry id ``XADD`` answers; the entry carries the
row's idempotency key, which is how a consumer drops a second copy (Redis does
not); a server that is down or does not answer leaves the row to be retried,
nothing lost; an entry over the server's size limit is stuck with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine

from outboxkit import Drainer
from outboxkit.policy import FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.redis_streams import RedisStreamsTransport
from tests.support.brokers import RedisServer, broker_drainer, drain_once_through, free_port, insert_rows


def entries(server: RedisServer, stream: str = "orders") -> list[dict[str, str]]:
    with redis.Redis(host="127.0.0.1", port=server.port, db=0, password=server.password, decode_responses=True) as client:
        return [fields for _, fields in client.xrange(stream)]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        assert isinstance(started, RedisServer)
        yield started


@pytest.fixture
def transport() -> Iterator[RedisStreamsTransport]:
    made = RedisStreamsTransport()
    yield made
    made.close()


@pytest.fixture
def drainer(engine: Engine, clock, transport: RedisStreamsTransport) -> Iterator[Drainer]:
    with broker_drainer(engine, clock, transport) as made:
        yield made


def test_rows_are_appended_and_done_on_the_entry_id(server, drainer, engine, read_events):
    ids = insert_rows(engine, f"{server.url}/0/orders", [{"n": n} for n in range(5)])

    result = drainer.drain_once()

    assert (result.delivered, result.retried, result.stuck) == (5, 0, 0)
    rows = read_events()
    assert all(rows[row_id].status == "done" and rows[row_id].last_error is None for row_id in ids)
    stored = entries(server)
    assert sorted(json.loads(fields["body"])["n"] for fields in stored) == list(range(5))
    assert {fields["idempotency_key"] for fields in stored} == {str(rows[row_id].idempotency_key) for row_id in ids}
    assert all(json.loads(fields["headers"]) == {"X-Kind": "event"} for fields in stored)


def test_the_entry_carries_the_key_and_the_answer_is_its_id(server, transport):
    delivery = Delivery(url=f"{server.url}/0/orders", json={"n": 1}, key="customer-7")

    result = transport.send(delivery, idempotency_key="row-key-1", timeout=5)

    assert result.succeeded and (result.acknowledgement or "").startswith("stream orders entry ")
    assert entries(server) == [{"idempotency_key": "row-key-1", "body": '{"n":1}', "key": "customer-7"}]


def test_a_second_send_of_a_row_is_stored_twice_with_the_same_idempotency_key(server, transport):
    # Redis does not de-duplicate (docs/transports.md): the consumer drops the copy by its idempotency_key.
    delivery = Delivery(url=f"{server.url}/0/orders", json={"n": 1})
    for _ in range(2):
        assert transport.send(delivery, idempotency_key="row-key-1", timeout=5).succeeded
    assert [fields["idempotency_key"] for fields in entries(server)] == ["row-key-1", "row-key-1"]


def test_a_server_down_at_start_is_retried_and_nothing_is_lost(engine, drainer, clock, read_events):
    port = free_port()
    [row_id] = insert_rows(engine, f"redis://127.0.0.1:{port}/0/orders", [{"n": 1}])

    first = drainer.drain_once()

    row = read_events()[row_id]
    assert (first.retried, row.status, row.attempts) == (1, "pending", 1)
    assert row.last_error.startswith("connection:")
    with RedisServer(port=port) as server:
        assert isinstance(server, RedisServer)
        clock.advance(seconds=1)
        assert drainer.drain_once().delivered == 1
        assert read_events()[row_id].status == "done"
        assert len(entries(server)) == 1


def test_an_entry_over_the_servers_size_limit_is_stuck_with_the_reason(server, drainer, engine, read_events):
    [row_id] = insert_rows(engine, f"{server.url}/0/orders", [{"text": "x" * (1024 * 1024 + 1)}])

    assert drainer.drain_once().stuck == 1

    row = read_events()[row_id]
    assert row.status == "stuck" and row.attempts == 1
    assert row.last_error.startswith("rejected: Redis answered Protocol error: invalid bulk length")


def test_a_key_that_is_not_a_stream_is_stuck_with_the_reason(server, drainer, engine, read_events):
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        client.set("orders", "a plain string")
    [row_id] = insert_rows(engine, f"{server.url}/0/orders", [{"n": 1}])

    assert drainer.drain_once().stuck == 1

    assert read_events()[row_id].last_error.startswith("rejected: Redis answered WRONGTYPE")


def test_a_server_that_does_not_answer_by_the_deadline_is_a_timeout_then_delivered(
    server, drainer, transport, engine, clock, read_events
):
    [row_id] = insert_rows(engine, f"{server.url}/0/orders", [{"n": 1}])
    assert transport.send(Delivery(url=f"{server.url}/0/warm"), idempotency_key="warm", timeout=5).succeeded
    server.pause()
    try:
        result = drainer.drain_once()
    finally:
        server.resume()

    row = read_events()[row_id]
    assert (result.retried, row.status) == (1, "pending")
    assert row.last_error.startswith("timeout:")
    clock.advance(seconds=1)
    assert drainer.drain_once().delivered == 1
    # At least once: the paused server may have appended the first copy too, under the same idempotency_key.
    assert {fields["idempotency_key"] for fields in entries(server)} == {str(read_events()[row_id].idempotency_key)}


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/orders", "redis://127.0.0.1:1/zero/orders", "nats://127.0.0.1:1/x"])
def test_a_url_that_names_no_database_and_stream_is_refused_before_sending(transport, url):
    result = transport.send(Delivery(url=url), idempotency_key="k", timeout=1)
    assert result.failure is FailureKind.REFUSED


def test_credentials_the_server_refuses_are_retried_and_the_row_goes_once_they_are_right(engine, clock, read_events):
    # Credentials are the transport's, not the message's: retried (the breaker holds the rows), never stuck.
    with RedisServer(password="right") as server:
        assert isinstance(server, RedisServer)
        [row_id] = insert_rows(engine, f"{server.url}/0/orders", [{"n": 1}])
        assert drain_once_through(engine, clock, RedisStreamsTransport(password="wrong")).retried == 1
        row = read_events()[row_id]
        assert row.status == "pending" and row.last_error.startswith("connection:")
        clock.advance(seconds=1)
        assert drain_once_through(engine, clock, RedisStreamsTransport(password="right")).delivered == 1
        assert len(entries(server)) == 1
