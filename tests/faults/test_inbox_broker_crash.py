"""Broker inbox consumers SIGKILLed between the commit and the acknowledgement: 0 lost, 0 applied twice.

For each broker (a real server started by the test), messages are published by
outboxkit's own transport; then consumer processes (tests/faults/broker_consumer.py)
are started one after the other, each killing itself (SIGKILL) right after the
commit of its N-th message and before that message's acknowledgement.  The
broker delivers the unacknowledged messages again to the next consumer: those
committed before the kill are found in the inbox and acknowledged without
running the handler, the others are handled.  A last consumer runs until the
broker has every message acknowledged.  Afterwards every counter is exactly 1,
each kill left at least one duplicate that was dropped, and the broker holds
nothing unacknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.faults.broker_consumer import DURABLE, QUEUE, REDIS_STREAM, STREAM, SUBJECT
from tests.faults.scenario import LONG_VARIANT
from tests.support.brokers import NatsServer, RabbitMqServer, RedisServer
from tests.support.database import sqlalchemy_url
from tests.support.inbox import applied, create_applied_table
from tests.support.inbox_brokers import counts, send_all


@dataclass(frozen=True)
class CrashSize:
    messages: int
    kills: int
    commits_before_kill: int


SIZES = [
    pytest.param(CrashSize(messages=60, kills=3, commits_before_kill=5), id="ci"),
    pytest.param(CrashSize(messages=2000, kills=10, commits_before_kill=40), id="long", marks=LONG_VARIANT),
]


class Broker:
    """One broker's server, how the scenario's messages are published, and whether everything is acknowledged."""

    name = ""

    def __init__(self, server: NatsServer | RedisServer | RabbitMqServer) -> None:
        self.server = server

    def publish(self, ids: list[str]) -> None:
        raise NotImplementedError

    def settled(self) -> bool:
        raise NotImplementedError


class Nats(Broker):
    name = "nats"

    def publish(self, ids: list[str]) -> None:
        import nats
        from nats.js.api import StreamConfig

        from outboxkit.transports.nats import NatsTransport

        async def add_stream() -> None:
            client = await nats.connect(self.server.url)
            try:
                await client.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["orders.>"]))
            finally:
                await client.close()

        asyncio.run(add_stream())
        transport = NatsTransport()
        try:
            send_all(transport, f"{self.server.url}/{SUBJECT}", ids)
        finally:
            transport.close()

    def settled(self) -> bool:
        import nats

        async def check() -> bool:
            client = await nats.connect(self.server.url)
            try:
                info = await client.jetstream().consumer_info(STREAM, DURABLE)
                return info.num_pending == 0 and info.num_ack_pending == 0
            finally:
                await client.close()

        return asyncio.run(check())


class Redis(Broker):
    name = "redis"

    def publish(self, ids: list[str]) -> None:
        from outboxkit.transports.redis_streams import RedisStreamsTransport

        transport = RedisStreamsTransport()
        try:
            send_all(transport, f"{self.server.url}/0/{REDIS_STREAM}", ids)
        finally:
            transport.close()

    def settled(self) -> bool:
        import redis

        client = redis.Redis.from_url(f"{self.server.url}/0")
        try:
            groups = client.xinfo_groups(REDIS_STREAM)
            last = client.xinfo_stream(REDIS_STREAM)["last-generated-id"]
            return bool(groups) and groups[0]["pending"] == 0 and groups[0]["last-delivered-id"] == last
        finally:
            client.close()


class RabbitMq(Broker):
    name = "rabbitmq"

    def _queue_size(self) -> int:
        import aio_pika

        async def declare() -> int:
            connection = await aio_pika.connect(self.server.url)
            async with connection:
                queue = await (await connection.channel()).declare_queue(QUEUE, durable=True)
                return int(queue.declaration_result.message_count or 0)

        return asyncio.run(declare())

    def publish(self, ids: list[str]) -> None:
        from outboxkit.transports.rabbitmq import RabbitMqTransport

        self._queue_size()  # declares the queue
        transport = RabbitMqTransport()
        try:
            send_all(transport, f"{self.server.url}/%2F?routing_key={QUEUE}", ids)
        finally:
            transport.close()

    def settled(self) -> bool:
        return self._queue_size() == 0  # ready messages; the consumer's unacknowledged ones are checked after it stops


BROKERS: dict[str, tuple[Callable[[], NatsServer | RedisServer | RabbitMqServer], type[Broker]]] = {
    "nats": (NatsServer, Nats), "redis": (RedisServer, Redis), "rabbitmq": (RabbitMqServer, RabbitMq),
}


@pytest.fixture(params=list(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    make_server, kind = BROKERS[request.param]
    server = make_server()
    with server:
        yield kind(server)


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        time.sleep(0.1)  # a database and a broker to poll: there is no single event to await


def start_consumer(broker: Broker, database_url: str, log: Path, kill_after: int | None) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "tests.faults.broker_consumer", broker.name,
        "--database-url", sqlalchemy_url(database_url), "--broker-url", broker.server.url,
    ]
    if kill_after is not None:
        command += ["--kill-after-commits", str(kill_after)]
    with log.open("ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("size", SIZES)
def test_a_consumer_killed_between_commit_and_ack_loses_nothing_and_applies_nothing_twice(
    size: CrashSize, broker: Broker, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    create_applied_table(engine)
    ids = [f"order-{n}" for n in range(size.messages)]
    broker.publish(ids)
    log = tmp_path / "consumers.log"
    for kill in range(size.kills):
        consumer = start_consumer(broker, database_url, log, kill_after=size.commits_before_kill)
        try:
            returncode = consumer.wait(timeout=240)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
        assert returncode == -signal.SIGKILL, f"consumer {kill} ended with {returncode}: {log.read_text()[-3000:]}"
    last = start_consumer(broker, database_url, log, kill_after=None)
    try:
        wait_until(
            lambda: len(applied(engine)) == size.messages and counts(engine)[0] >= size.kills and broker.settled(),
            timeout=240, what=f"{size.messages} applied and acknowledged",
        )
    finally:
        last.send_signal(signal.SIGTERM)
        try:
            last.wait(timeout=60)
        except subprocess.TimeoutExpired:
            last.kill()
            last.wait()
    counters = applied(engine)
    assert sorted(counters) == sorted(ids), "lost messages"
    assert {message_id for message_id, times in counters.items() if times != 1} == set(), "applied twice"
    duplicates, failures = counts(engine)
    assert duplicates >= size.kills  # each killed consumer's last commit came back unacknowledged, and was dropped
    assert failures == 0
    assert broker.settled()
