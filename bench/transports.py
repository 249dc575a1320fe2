"""Broker transports beside HTTP: rows per second through the real drain, acknowledgements on, in one run.

Against a real PostgreSQL (``DATABASE_URL``, else
``postgresql://root@127.0.0.1:5432/test``), in a scratch database it creates
and drops, ``--rows`` rows (default 20,000) are bulk-inserted and drained by
one ``Drainer`` background loop (``Drainer.start``, default options: batches
of 50, 32 sends in flight), timed from the start of the drain to the last row
``done``, once per transport:

* ``http``: ``HttpTransport`` to ``bench/receiver.py`` in its own process;
* ``nats``: ``NatsTransport`` to a JetStream stream on a private
  ``nats-server`` (file storage), each row done on its ``PubAck``;
* ``redis``: ``RedisStreamsTransport`` to a private ``redis-server``
  (no persistence), each row done on its entry id;
* ``rabbitmq``: ``RabbitMqTransport`` to a private RabbitMQ node, persistent
  messages to a durable queue, each row done on its publisher confirm;
* ``kafka``: ``KafkaTransport`` to a private Tansu broker (a Kafka-protocol
  broker, memory storage: not Apache Kafka), a topic of 3 partitions, each
  row done on its delivery report (idempotent producer, ``acks=all``).

``--transports`` picks the brokers (default all); HTTP always runs, as the
figure the others are compared with in the same run.

To say where the limit is, the same number of sends is also made through
each broker transport alone, from 32 threads and with no database
(``sends_per_s_<transport>_alone``): when that is far above the drain's rate,
the drain is the bound, not the broker; ``drainer_cpu_ms_per_row_<transport>``
(this process's CPU over the drain, the transport's own loop thread included)
says how much of a core one row costs the drainer.  A second NATS drain with
batches of 200 and 200 sends in flight (``rows_per_s_nats_batch_200``) shows
what fewer claims and outcome commits per row buy.
Each broker's count of stored messages is checked against the rows.

The servers listen on free ports on 127.0.0.1 and are stopped by pid.  Run
from the repository root::

    .venv/bin/python bench/transports.py --rows 20000
    .venv/bin/python bench/transports.py --rows 20000 --transports kafka

The last line printed is one JSON object: ``rows_per_s_<transport>``,
``sends_per_s_<transport>_alone``, the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import aio_pika  # noqa: E402
import confluent_kafka  # noqa: E402
import nats  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from confluent_kafka.cimpl import NewTopic  # noqa: E402 - the class confluent_kafka.admin re-exports untyped
from nats.js.api import StreamConfig  # noqa: E402
from sqlalchemy import Engine, Text, create_engine, func, insert, select, text  # noqa: E402
from sqlalchemy.dialects.postgresql import JSONB  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from bench.drain_throughput import ReceiverProcess  # noqa: E402
from outboxkit import Delivery, Drainer, HttpTransport, Outbox, OutboxOptions, Transport  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402
from outboxkit.transports.kafka import KafkaTransport  # noqa: E402
from outboxkit.transports.nats import NatsTransport  # noqa: E402
from outboxkit.transports.rabbitmq import RabbitMqTransport  # noqa: E402
from outboxkit.transports.redis_streams import RedisStreamsTransport  # noqa: E402
from tests.support.brokers import KafkaServer, NatsServer, RabbitMqServer, RedisServer  # noqa: E402

THREADS = 32  # the drain's default concurrency
BROKERS = ("nats", "redis", "rabbitmq", "kafka")
BIG_BATCH = 200  # a second NATS drain, with batches of 200 and 200 sends in flight: fewer claims and commits per row


class BenchBase(DeclarativeBase):
    pass


class TransportBenchOutbox(Outbox, BenchBase):
    __tablename__ = "bench_transport_outbox"
    __outbox__ = OutboxOptions(job_name="bench-transports")

    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json=self.payload, key=str(self.payload["n"] % 100))


def drain_rate(engine: Engine, transport: Transport, url: str, rows: int, **options: Any) -> tuple[float, float]:
    """Rows/s and this process's CPU ms per row: insert ``rows`` rows addressed to ``url``, drain them all."""
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE bench_transport_outbox"))
        values = [{"target_url": url, "payload": {"n": n, "order": f"order-{n}"}} for n in range(rows)]
        for start in range(0, rows, 5_000):
            connection.execute(insert(TransportBenchOutbox), values[start : start + 5_000])
        connection.execute(text("ANALYZE bench_transport_outbox"))
    pending = select(func.count()).select_from(TransportBenchOutbox).where(TransportBenchOutbox.status != "done")
    outbox_options = dataclasses.replace(TransportBenchOutbox.__outbox__, **options)
    drainer = Drainer(engine, TransportBenchOutbox, transport=transport, options=outbox_options)
    started, cpu_started = time.monotonic(), time.process_time()
    drainer.start(poll_seconds=1)
    try:
        while True:
            threading.Event().wait(0.1)
            with engine.connect() as connection:
                if not connection.execute(pending).scalar_one():
                    break
        return rows / (time.monotonic() - started), (time.process_time() - cpu_started) * 1000 / rows
    finally:
        drainer.close()


def alone_rate(transport: Transport, url: str, sends: int) -> float:
    """Sends/s through ``transport`` alone, from ``THREADS`` threads, no database; every one must be accepted."""
    def one(n: int) -> bool:
        delivery = Delivery(url=url, json={"n": n, "order": f"order-{n}"}, key=str(n % 100))
        return transport.send(delivery, idempotency_key=f"alone-{n}", timeout=10).succeeded

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        accepted = sum(pool.map(one, range(sends)))
    elapsed = time.monotonic() - started
    if accepted != sends:
        raise RuntimeError(f"{sends - accepted} of {sends} sends were not accepted")
    return sends / elapsed


def nats_stored(server: NatsServer, stream: str) -> int:
    async def count() -> int:
        client = await nats.connect(server.url)
        try:
            return int((await client.jetstream().stream_info(stream)).state.messages)
        finally:
            await client.close()

    return asyncio.run(count())


def add_nats_stream(server: NatsServer, name: str, subject: str) -> None:
    async def add() -> None:
        client = await nats.connect(server.url)
        try:
            await client.jetstream().add_stream(StreamConfig(name=name, subjects=[subject]))
        finally:
            await client.close()

    asyncio.run(add())


def record(figures: dict[str, Any], transport: str, measured: tuple[float, float]) -> None:
    rate, cpu_ms = measured
    figures[f"rows_per_s_{transport}"] = round(rate, 1)
    figures[f"drainer_cpu_ms_per_row_{transport}"] = round(cpu_ms, 3)


def rabbitmq_queues(server: RabbitMqServer, names: list[str]) -> Callable[[], dict[str, int]]:
    """Declare a durable queue per name, bound to the direct exchange ``bench`` under its name; the counter of each."""
    async def declare() -> None:
        connection = await aio_pika.connect(f"{server.url}/%2F")
        try:
            channel = await connection.channel()
            exchange = await channel.declare_exchange("bench", aio_pika.ExchangeType.DIRECT)
            for name in names:
                await (await channel.declare_queue(name, durable=True)).bind(exchange, name)
        finally:
            await connection.close()

    async def count() -> dict[str, int]:
        connection = await aio_pika.connect(f"{server.url}/%2F")
        try:
            channel = await connection.channel()
            return {name: int((await channel.declare_queue(name, durable=True)).declaration_result.message_count or 0)
                    for name in names}
        finally:
            await connection.close()

    asyncio.run(declare())
    return lambda: asyncio.run(count())


def add_kafka_topics(server: KafkaServer, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    created = admin.create_topics([NewTopic(name, num_partitions=3) for name in names])
    for future in created.values():
        future.result(10)


def kafka_stored(server: KafkaServer, topic: str, expected: int) -> int:
    """The messages ``topic`` holds, read from the start of each partition until ``expected`` arrive or none come
    for two seconds (Tansu's high watermarks count batches, not messages, so they cannot be asked)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": "bench",
                                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([confluent_kafka.TopicPartition(topic, partition, confluent_kafka.OFFSET_BEGINNING)
                         for partition in partitions])
        count = 0
        while count < expected:
            batch = consumer.consume(1000, timeout=2)
            if not batch:
                break
            count += sum(1 for message in batch if message.error() is None)
        return count
    finally:
        consumer.close()


def run(rows: int, brokers: tuple[str, ...] = BROKERS) -> dict[str, Any]:
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=10)
    load_before = os.getloadavg()
    figures: dict[str, Any] = {"rows": rows, "drain_concurrency": THREADS, "drain_batch_size": 50}
    try:
        kit_metadata.create_all(engine)
        BenchBase.metadata.create_all(engine)

        receiver = ReceiverProcess()
        try:
            with HttpTransport() as http:
                record(figures, "http", drain_rate(engine, http, f"{receiver.url}/events", rows))
        finally:
            receiver.stop()
        print(f"http: {figures['rows_per_s_http']} rows/s", flush=True)

        if "nats" in brokers:
            with NatsServer(max_payload=1024 * 1024) as nats_server:
                assert isinstance(nats_server, NatsServer)
                add_nats_stream(nats_server, "BENCH", "bench.orders")
                add_nats_stream(nats_server, "ALONE", "alone.>")
                add_nats_stream(nats_server, "BIG", "bench.big")
                nats_transport = NatsTransport()
                try:
                    alone = alone_rate(nats_transport, f"{nats_server.url}/alone.orders", rows)
                    figures["sends_per_s_nats_alone"] = round(alone, 1)
                    record(figures, "nats", drain_rate(engine, nats_transport, f"{nats_server.url}/bench.orders", rows))
                    record(figures, f"nats_batch_{BIG_BATCH}", drain_rate(
                        engine, nats_transport, f"{nats_server.url}/bench.big", rows, batch_size=BIG_BATCH, concurrency=BIG_BATCH
                    ))
                finally:
                    nats_transport.close()
                figures["nats_stored"] = nats_stored(nats_server, "BENCH")
                figures[f"nats_batch_{BIG_BATCH}_stored"] = nats_stored(nats_server, "BIG")
            print(f"nats: {figures['rows_per_s_nats']} rows/s, alone {figures['sends_per_s_nats_alone']} sends/s", flush=True)

        if "redis" in brokers:
            with RedisServer() as redis_server:
                assert isinstance(redis_server, RedisServer)
                redis_transport = RedisStreamsTransport()
                try:
                    alone = alone_rate(redis_transport, f"{redis_server.url}/0/alone", rows)
                    figures["sends_per_s_redis_alone"] = round(alone, 1)
                    record(figures, "redis", drain_rate(engine, redis_transport, f"{redis_server.url}/0/bench", rows))
                finally:
                    redis_transport.close()
                with redis.Redis(host="127.0.0.1", port=redis_server.port) as client:
                    figures["redis_entries"] = int(client.xlen("bench"))
            print(f"redis: {figures['rows_per_s_redis']} rows/s, alone {figures['sends_per_s_redis_alone']} sends/s", flush=True)

        if "rabbitmq" in brokers:
            with RabbitMqServer(max_message_size=1024 * 1024) as rabbitmq_server:
                assert isinstance(rabbitmq_server, RabbitMqServer)
                counts = rabbitmq_queues(rabbitmq_server, ["alone", "orders"])
                rabbitmq_transport = RabbitMqTransport()
                address = f"{rabbitmq_server.url}/%2F?exchange=bench&routing_key="
                try:
                    figures["sends_per_s_rabbitmq_alone"] = round(alone_rate(rabbitmq_transport, address + "alone", rows), 1)
                    record(figures, "rabbitmq", drain_rate(engine, rabbitmq_transport, address + "orders", rows))
                finally:
                    rabbitmq_transport.close()
                figures["rabbitmq_queued"] = counts()["orders"]
            print(f"rabbitmq: {figures['rows_per_s_rabbitmq']} rows/s, alone {figures['sends_per_s_rabbitmq_alone']} sends/s",
                  flush=True)
        if "kafka" in brokers:
            with KafkaServer() as kafka_server:
                assert isinstance(kafka_server, KafkaServer)
                add_kafka_topics(kafka_server, ["alone", "bench"])
                kafka_transport = KafkaTransport()
                try:
                    figures["sends_per_s_kafka_alone"] = round(alone_rate(kafka_transport, f"{kafka_server.url}/alone", rows), 1)
                    record(figures, "kafka", drain_rate(engine, kafka_transport, f"{kafka_server.url}/bench", rows))
                finally:
                    kafka_transport.close()
                figures["kafka_stored"] = kafka_stored(kafka_server, "bench", rows)
            print(f"kafka: {figures['rows_per_s_kafka']} rows/s, alone {figures['sends_per_s_kafka_alone']} sends/s", flush=True)
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
    for name in brokers:
        figures[f"{name}_over_http"] = round(figures[f"rows_per_s_{name}"] / figures["rows_per_s_http"], 2)
    figures["load_average_before"] = [round(value, 2) for value in load_before]
    figures["load_average_after"] = [round(value, 2) for value in os.getloadavg()]
    figures["cpus"] = os.cpu_count()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--transports", default=",".join(BROKERS),
                        help=f"comma-separated brokers to measure beside HTTP (default: {','.join(BROKERS)})")
    options = parser.parse_args()
    brokers = tuple(name for name in options.transports.split(",") if name)
    unknown = sorted(set(brokers) - set(BROKERS))
    if unknown:
        parser.error(f"unknown transports {unknown}; choose from {', '.join(BROKERS)}")
    print(json.dumps(run(options.rows, brokers)))


if __name__ == "__main__":
    main()
