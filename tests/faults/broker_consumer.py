"""A broker inbox consumer as a process of its own, which can SIGKILL itself between a commit and its acknowledgement.

::

    python -m tests.faults.broker_consumer nats --database-url postgresql+psycopg://... --broker-url nats://... \
        [--kill-after-commits N]

It consumes the scenario's stream or queue (``nats``: a pull consumer of the
stream ``ORDERS``; ``redis``: the group ``billing`` of the stream ``orders``;
``rabbitmq``: the queue ``orders``) with the broker's inbox, whose handler adds
one to the message's counter in ``applied``.  With ``--kill-after-commits N``
an observer SIGKILLs the process when it hears the N-th message handled: the
inbox calls it after the transaction committed and before the broker is
acknowledged, so that message is committed and unacknowledged, and the broker
delivers it again to the next consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit.inbox.brokers import BrokerInbox, BrokerMessage
from tests.support.inbox import apply

SOURCE = "orders"
STREAM, DURABLE, SUBJECT = "ORDERS", "billing", "orders.created"
REDIS_STREAM, GROUP = "orders", "billing"
QUEUE = "orders"
# How long a broker waits for an acknowledgement before it delivers the message again (NATS, Redis).
REDELIVER_SECONDS = 1.0


class KillAfterCommits:
    """An inbox observer that SIGKILLs this process when the ``after``-th message has been handled (committed)."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.handled = 0

    def message_handled(self, source: str) -> None:
        self.handled += 1
        if self.after is not None and self.handled >= self.after:
            os.kill(os.getpid(), signal.SIGKILL)

    def duplicate_dropped(self, source: str) -> None:
        pass

    def handler_failed(self, source: str) -> None:
        pass


def handle(session: Session, message: BrokerMessage) -> None:
    apply(session, message.message_id)


async def consume_nats(inbox: BrokerInbox, url: str, stop: asyncio.Event) -> None:
    import nats
    from nats.js.api import ConsumerConfig

    from outboxkit.inbox.nats import NatsInbox

    assert isinstance(inbox, NatsInbox)
    client = await nats.connect(url)
    try:
        subscription = await client.jetstream().pull_subscribe(
            SUBJECT, durable=DURABLE, config=ConsumerConfig(ack_wait=REDELIVER_SECONDS, max_deliver=-1)
        )
        await inbox.run(subscription, stop, wait_seconds=0.5)
    finally:
        await client.close()


async def consume_redis(inbox: BrokerInbox, url: str, stop: asyncio.Event) -> None:
    from outboxkit.inbox.redis_streams import RedisStreamsInbox

    assert isinstance(inbox, RedisStreamsInbox)
    await inbox.create_group()
    try:
        await inbox.run(stop, count=10, block_seconds=0.5)
    finally:
        await inbox.client.aclose()


async def consume_rabbitmq(inbox: BrokerInbox, url: str, stop: asyncio.Event) -> None:
    import aio_pika

    from outboxkit.inbox.rabbitmq import RabbitMqInbox

    assert isinstance(inbox, RabbitMqInbox)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.consume(inbox.process)
        await stop.wait()


def build_inbox(broker: str, database_url: str, broker_url: str, observer: KillAfterCommits) -> BrokerInbox:
    engine = create_engine(database_url, pool_size=2)
    if broker == "nats":
        from outboxkit.inbox.nats import NatsInbox

        return NatsInbox(engine, source=SOURCE, handler=handle, retry_delay_seconds=0.1, observers=[observer])
    if broker == "redis":
        import redis.asyncio

        from outboxkit.inbox.redis_streams import RedisStreamsInbox

        return RedisStreamsInbox(
            engine, source=SOURCE, handler=handle, client=redis.asyncio.Redis.from_url(f"{broker_url}/0"),
            stream=REDIS_STREAM, group=GROUP, consumer="consumer", retry_after_seconds=REDELIVER_SECONDS,
            max_deliveries=1000, observers=[observer],
        )
    from outboxkit.inbox.rabbitmq import RabbitMqInbox

    return RabbitMqInbox(engine, source=SOURCE, handler=handle, retry_delay_seconds=0.1, observers=[observer])


async def main(arguments: argparse.Namespace) -> None:
    observer = KillAfterCommits(arguments.kill_after_commits)
    inbox = build_inbox(arguments.broker, arguments.database_url, arguments.broker_url, observer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    consume = {"nats": consume_nats, "redis": consume_redis, "rabbitmq": consume_rabbitmq}[arguments.broker]
    await consume(inbox, arguments.broker_url, stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("broker", choices=["nats", "redis", "rabbitmq"])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--kill-after-commits", type=int, default=None)
    asyncio.run(main(parser.parse_args()))
