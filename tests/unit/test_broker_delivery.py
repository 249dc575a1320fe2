"""A broker delivery: its URL, key and destination, and what a broker's answers mean for the row and its breaker."""

from __future__ import annotations

import re
import sys
from datetime import datetime, timezone

import pytest

from outboxkit.breaker import Signal, destination_of, signal_of
from outboxkit.errors import ConfigurationError, InvalidValueError
from outboxkit.policy import AttemptResult, FailureKind, RetryPolicy
from outboxkit.transports.base import Delivery
from outboxkit.transports.http import HttpTransport
from outboxkit.transports.kafka import KafkaTransport
from outboxkit.transports.nats import NatsTransport
from outboxkit.transports.rabbitmq import RabbitMqTransport
from outboxkit.transports.redis_streams import RedisStreamsTransport
from outboxkit.transports.sqs import SqsTransport

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        ("nats://127.0.0.1:4222/orders.created", "nats://127.0.0.1:4222"),
        ("nats://broker.internal/orders.created", "nats://broker.internal:4222"),
        ("redis://127.0.0.1:6379/0/orders", "redis://127.0.0.1:6379"),
        ("rediss://cache.internal/2/orders", "rediss://cache.internal:6379"),
        ("amqp://127.0.0.1:5672/%2F?exchange=orders&routing_key=created", "amqp://127.0.0.1:5672"),
        ("amqps://rabbit.internal/%2F?exchange=orders", "amqps://rabbit.internal:5671"),
        ("sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", "sqs://sqs.eu-west-1.amazonaws.com:443"),
        ("sqs://127.0.0.1:5000/123456789012/orders", "sqs://127.0.0.1:5000"),
        ("kafka://127.0.0.1:9092/orders", "kafka://127.0.0.1:9092"),
        ("kafka://kafka.internal/orders", "kafka://kafka.internal:9092"),
    ],
)
def test_a_broker_url_is_a_delivery_whose_destination_is_its_server(url, destination):
    delivery = Delivery(url=url, json={"order": 7}, key="customer-3", headers={"Event-Type": "order.created"})
    assert delivery.body() == b'{"order":7}'
    assert delivery.key == "customer-3"
    assert destination_of(delivery.url) == destination


def test_the_key_survives_added_headers():
    delivery = Delivery(url="nats://127.0.0.1:4222/orders", key="k").with_headers({"traceparent": "00-1-2-01"})
    assert delivery.key == "k"
    assert delivery.headers == {"traceparent": "00-1-2-01"}


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:4222",  # no subject
        "nats://127.0.0.1:4222/",
        "nats:///orders",  # no host
        "kafka://127.0.0.1:9092",  # no topic
        "mqtt://127.0.0.1:1883/orders",  # no transport for this scheme
        "redis://127.0.0.1:99999/0/orders",
    ],
)
def test_a_broker_url_without_a_target_or_server_is_refused(url):
    with pytest.raises(ValueError, match=r"Delivery.url must be an absolute http\(s\) URL with a host, or a broker"):
        Delivery(url=url)


def test_a_broker_url_with_credentials_is_refused_with_where_they_go():
    with pytest.raises(ValueError, match="give them to the broker's transport"):
        Delivery(url="redis://user:secret@127.0.0.1:6379/0/orders")


@pytest.mark.parametrize("key", ["", 7, "k" * 1025])
def test_a_bad_key_is_refused(key):
    with pytest.raises(ValueError, match="Delivery.key must be a non-empty str"):
        Delivery(url="nats://127.0.0.1:4222/orders", key=key)


def test_the_http_transport_refuses_a_broker_url_before_sending():
    with HttpTransport() as transport:
        result = transport.send(Delivery(url="nats://127.0.0.1:1/orders"), idempotency_key="k", timeout=1)
    assert result.failure is FailureKind.REFUSED
    assert "broker's URL" in (result.error or "")
    assert RetryPolicy().decide(result, attempts=1, now=NOW).status == "stuck"


def test_an_acknowledgement_is_done_and_says_what_the_broker_answered():
    result = AttemptResult(acknowledgement="stream ORDERS seq 42")
    assert result.succeeded
    decision = RetryPolicy().decide(result, attempts=1, now=NOW)
    assert (decision.status, decision.reason) == ("done", "acknowledged: stream ORDERS seq 42")


def test_a_rejection_is_stuck_at_once_even_on_the_first_attempt():
    result = AttemptResult(failure=FailureKind.REJECTED, error="rejected: message over the server's 1024-byte limit")
    assert not result.succeeded
    decision = RetryPolicy().decide(result, attempts=1, now=NOW)
    assert (decision.status, decision.reason) == ("stuck", "rejected by the receiver; not retried")


@pytest.mark.parametrize(
    ("result", "signal"),
    [
        (AttemptResult(acknowledgement="1-0"), Signal.SUCCESS),
        (AttemptResult(failure=FailureKind.REJECTED, error="too large"), Signal.SUCCESS),  # there and answering
        (AttemptResult(failure=FailureKind.CONNECTION, error="refused"), Signal.FAILURE),
        (AttemptResult(failure=FailureKind.TIMEOUT, error="no ack"), Signal.FAILURE),
    ],
)
def test_what_a_broker_answer_says_about_its_destination(result, signal):
    reading = signal_of(result, now=NOW)
    assert reading is not None
    assert reading.signal is signal


@pytest.mark.parametrize(
    ("transport_class", "client", "extra"),
    [(NatsTransport, "nats", "nats"), (RedisStreamsTransport, "redis", "redis"), (RabbitMqTransport, "aio_pika", "rabbitmq")],
)
def test_a_broker_transport_without_its_client_library_says_how_to_install_it(monkeypatch, transport_class, client, extra):
    monkeypatch.setitem(sys.modules, client, None)  # as if the library were not installed
    with pytest.raises(ConfigurationError, match=re.escape(f"pip install 'outboxkit[{extra}]'")):
        transport_class()


def test_the_kafka_transport_without_confluent_kafka_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # as if confluent-kafka were not installed
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'outboxkit[kafka]'")):
        KafkaTransport()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"no.such.setting": "1"}, "No such configuration property"),
        ({"linger.ms": "soon"}, "Invalid value for configuration property"),
        ({"enable.idempotence": False}, "enable.idempotence is the transport's"),
        ({"acks": "1"}, "acks is the transport's"),
        ({"bootstrap.servers": "elsewhere:9092"}, "bootstrap.servers is the URL's"),
    ],
)
def test_the_kafka_transport_refuses_bad_producer_settings_at_start(config, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        KafkaTransport(config=config)


def test_the_kafka_transport_refuses_before_sending_what_kafka_would_refuse():
    transport = KafkaTransport()
    try:
        elsewhere = transport.send(Delivery(url="nats://127.0.0.1:1/orders"), idempotency_key="k", timeout=1)
        bad_topic = transport.send(Delivery(url="kafka://127.0.0.1:1/orders/created"), idempotency_key="k", timeout=1)
    finally:
        transport.close()
    assert elsewhere.failure is FailureKind.REFUSED and "sends kafka:// URLs" in (elsewhere.error or "")
    assert bad_topic.failure is FailureKind.REFUSED and "not a Kafka topic name" in (bad_topic.error or "")


def test_the_sqs_transport_without_boto3_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3.session", None)  # as if boto3 were not installed
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'outboxkit[sqs]'")):
        SqsTransport(region="eu-west-1")


def test_the_sqs_transport_refuses_before_sending_what_sqs_would_refuse():
    transport = SqsTransport(region="eu-west-1", access_key_id="a", secret_access_key="b", endpoint_scheme="http")
    try:
        fifo = "sqs://127.0.0.1:1/123456789012/orders.fifo"  # nothing listens: a send would be a connection failure
        keyless = transport.send(Delivery(url=fifo, json={}), idempotency_key="k", timeout=1)
        crowded = transport.send(
            Delivery(url=fifo, json={}, key="g", headers={f"X-H{n}": "v" for n in range(9)}), idempotency_key="k", timeout=1
        )
        elsewhere = transport.send(Delivery(url="nats://127.0.0.1:1/orders", json={}), idempotency_key="k", timeout=1)
    finally:
        transport.close()
    assert keyless.failure is FailureKind.REFUSED and "needs a message group" in (keyless.error or "")
    assert crowded.failure is FailureKind.REJECTED and "11 message attributes" in (crowded.error or "")
    assert elsewhere.failure is FailureKind.REFUSED and "sends sqs:// URLs" in (elsewhere.error or "")


@pytest.mark.parametrize("options", [{"endpoint_scheme": "ftp"}, {"max_message_size": 0}, {"max_message_size": True}])
def test_the_sqs_transport_refuses_bad_options(options):
    with pytest.raises(InvalidValueError):
        SqsTransport(region="eu-west-1", **options)
