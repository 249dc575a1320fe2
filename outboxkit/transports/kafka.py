"""Kafka delivery on confluent-kafka (the ``kafka`` extra: ``pip install 'outboxkit[kafka]'``).

A row goes to ``kafka://host:port/<topic>`` (the host and port are the
bootstrap server; 9092 by default).  It is produced by an idempotent producer
(``enable.idempotence=true``, ``acks=all``): the delivery's ``key`` is the
message key, so one key's messages land in one partition in order; its
headers, and the row's idempotency key as ``Idempotency-Key``, are the
message's headers; its JSON is the value.

The outcome rules:

* accepted (``done``) only on the message's delivery report without an error:
  every in-sync replica stored it; the acknowledgement names its topic,
  partition and offset;
* ``rejected`` (``stuck`` at once, nothing will change by sending it again):
  a topic the cluster does not have (create it, then reset the rows), a
  message over the producer's or the broker's size limit, a record the broker
  refuses as invalid;
* refused before sending (``stuck``): a URL whose path is not a topic name;
* retried: the broker down or unreachable, no delivery report by the deadline
  (the message may be stored: the retry carries the same ``Idempotency-Key``,
  by which the consumer drops the second copy; the sends that shared the
  producer are withdrawn with it, and are retried too), and any other error of the
  broker or the client, credentials the broker refuses included: they are the
  transport's, not the message's, so the breaker opens and the rows wait.

Why the topic is looked up before the first message to it: a cluster that
creates topics on first use (``auto.create.topics.enable``, often on) would
otherwise make a topic of every misspelt URL, and one that does not would
keep the message queued until the deadline, a timeout retried forever.  The
topic list (a metadata request that creates nothing) is asked once per
producer and topic; a topic that is missing is asked for again at each send,
so it is found as soon as it is made.

One producer per bootstrap server, made on first use; the sends of a batch
run on the drain's send threads and share it, so their messages go together
in the producer's batches (``linger.ms``, 5 ms here unless set): one request
per partition, not one round trip per row.  A background thread serves the
producer's delivery reports.  A send that gets no report by its deadline
retires the producer: its queue is purged (so no stale copy is sent after the
retry, out of order) and the next send makes a new one, with a new producer
id, which also recovers a broker that came back without the producer's state.

Options of the producer (TLS, SASL credentials, ``linger.ms``,
``message.max.bytes``...) are given as ``config``, librdkafka's names; they
are checked when the transport is made.  librdkafka's log lines go to this
module's logger (``outboxkit.transports.kafka``) at DEBUG.  ``bootstrap.servers`` comes from the
URL, and ``enable.idempotence`` and ``acks`` are the transport's.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery

__all__ = ["KafkaTransport"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'outboxkit[kafka]'"
IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_PORT = 9092
# Kafka's own rule for a topic name.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# What the transport sets and a caller may not change: the guarantees rest on them.
_FIXED = {"bootstrap.servers": "the URL's", "enable.idempotence": "the transport's", "acks": "the transport's"}
_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "client.id": "outboxkit"}
# Broker or client errors that refuse this message whatever is sent again.
_REJECTED = frozenset({
    "MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD", "CORRUPT_MESSAGE",
    "INVALID_TOPIC_EXCEPTION", "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION",
})
_CONNECTION = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_SSL", "_AUTHENTICATION", "NETWORK_EXCEPTION"})
POLL_SECONDS = 0.05


def _confluent_kafka() -> Any:
    """The one place confluent-kafka is imported."""
    try:
        import confluent_kafka
    except ImportError:
        raise ConfigurationError(f"KafkaTransport needs confluent-kafka: {INSTALL_HINT}") from None
    return confluent_kafka


class KafkaTransport:
    """Produces each delivery with an idempotent producer and waits for its delivery report; never raises for a
    failed send.

    ``config`` holds librdkafka producer settings (``security.protocol``,
    ``sasl.username``, ``linger.ms``, ``message.max.bytes``...); a setting
    librdkafka does not know, or a value it refuses, is a ``ConfigurationError``
    here.  ``metadata_timeout`` bounds the topic lookup of a send (its own
    deadline bounds it too).
    """

    def __init__(self, *, config: Mapping[str, Any] | None = None, metadata_timeout: float = 2.0) -> None:
        self._kafka = _confluent_kafka()
        given = dict(config or {})
        for name, owner in _FIXED.items():
            if name in given:
                raise ConfigurationError(f"KafkaTransport config: {name} is {owner} (drop it from config)")
        # librdkafka's own lines (a failed connect, a broker that went away) go to this module's logger, served on the
        # producer's poll thread, unless config names a logger of its own.
        self._config = {**_DEFAULTS, "logger": _ClientLog(), **given, "enable.idempotence": True, "acks": "all"}
        try:  # librdkafka checks every name and value when a client is made: made and dropped, it connects nowhere
            self._kafka.Producer({**self._config, "log_level": 4})  # not its notice that it has no bootstrap servers
        except (self._kafka.KafkaException, TypeError, ValueError) as exc:
            raise ConfigurationError(f"KafkaTransport config is refused by librdkafka: {_describe(exc)}") from None
        self._metadata_timeout = metadata_timeout
        self._producers: dict[str, _Producer] = {}
        self._lock = threading.Lock()

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        deadline = time.monotonic() + timeout
        parts = urlsplit(delivery.url)
        if parts.scheme != "kafka":
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: KafkaTransport sends kafka:// URLs, got {parts.scheme}://",
            )
        topic = unquote(parts.path.lstrip("/"))
        if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: {topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-')",
            )
        server = f"{parts.hostname}:{parts.port or DEFAULT_PORT}"
        producer = self._producer(server)
        missing = self._missing_topic(producer, server, topic, deadline)
        if missing is not None:
            return missing
        headers = [(name, value.encode()) for name, value in delivery.headers.items()]
        headers.append((IDEMPOTENCY_HEADER, idempotency_key.encode()))
        report = _Report()
        try:
            producer.client.produce(
                topic, value=delivery.body(), key=delivery.key, headers=headers, on_delivery=report.done
            )
        except BufferError:
            return AttemptResult(
                failure=FailureKind.TRANSPORT, error="the producer's queue is full (queue.buffering.max.messages)"
            )
        except self._kafka.KafkaException as exc:
            if exc.args[0].fatal():  # the producer can send nothing more: the next send makes a new one
                self._retire(server, producer)
            return _result_of_error(exc.args[0])
        if not report.finished.wait(max(0.0, deadline - time.monotonic())):
            self._retire(server, producer)
            error = f"timeout: no delivery report from Kafka within {timeout:g} s"
            return AttemptResult(failure=FailureKind.TIMEOUT, error=error)
        if report.error is not None:
            if report.error.fatal():
                self._retire(server, producer)
            return _result_of_error(report.error)
        return AttemptResult(acknowledgement=f"topic {topic} partition {report.partition} offset {report.offset}")

    def _missing_topic(self, producer: _Producer, server: str, topic: str, deadline: float) -> AttemptResult | None:
        """None when the cluster has ``topic``; else why the send stops here (no such topic, or no answer)."""
        if topic in producer.topics:
            return None
        wait = min(self._metadata_timeout, deadline - time.monotonic())
        try:
            metadata = producer.client.list_topics(timeout=max(wait, 0.001))  # all topics: asking for one may create it
        except self._kafka.KafkaException as exc:
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: no metadata from {server}: {_describe(exc)}")
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return AttemptResult(
                failure=FailureKind.REJECTED,
                error=f"rejected: no topic {topic!r} on {server} (create it, then reset the rows)",
            )
        producer.topics.add(topic)
        return None

    def _producer(self, server: str) -> _Producer:
        with self._lock:
            producer = self._producers.get(server)
            if producer is None:
                producer = _Producer(self._kafka.Producer({**self._config, "bootstrap.servers": server}), server)
                self._producers[server] = producer
            return producer

    def _retire(self, server: str, producer: _Producer) -> None:
        """Drop ``producer`` (its state is in doubt); the next send to ``server`` makes a new one."""
        with self._lock:
            if self._producers.get(server) is producer:
                del self._producers[server]
        producer.retire()

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()


class _ClientLog:
    """librdkafka's log lines, at DEBUG: a broker that is down repeats them at every reconnect, and what they say
    reaches each send's result anyway (as the NATS transport treats its client's errors)."""

    def log(self, level: int, message: str, *args: object) -> None:
        logger.debug(message, *args)


class _Report:
    """One message's delivery report, set on the producer's poll thread."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self.error: Any = None
        self.partition = -1
        self.offset = -1

    def done(self, error: Any, message: Any) -> None:
        self.error = error
        if error is None:
            self.partition, self.offset = message.partition(), message.offset()
        self.finished.set()


class _Producer:
    """A confluent-kafka producer, the topics known to exist, and the thread that serves its delivery reports."""

    def __init__(self, client: Any, server: str) -> None:
        self.client = client
        self.topics: set[str] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"outboxkit-kafka-{server}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self.client.poll(POLL_SECONDS)
        ends = time.monotonic() + 1.0
        while len(self.client) and time.monotonic() < ends:  # the purge's reports, to the sends still waiting
            self.client.poll(POLL_SECONDS)

    def retire(self) -> None:
        """Purge what is queued or in flight (those sends report a failure and are retried) and stop serving."""
        self.client.purge(in_queue=True, in_flight=True, blocking=False)
        self._stopping.set()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join()
        remaining = self.client.flush(0)  # a closing drain has no sends left; anything still here is purged
        if remaining:
            logger.debug("closing a Kafka producer with %d messages unsent", remaining)
            self.client.purge(in_queue=True, in_flight=True, blocking=False)
            self.client.poll(0)


def _result_of_error(error: Any) -> AttemptResult:
    name = error.name()
    text = f"{name}: {error.str()}"
    if name in ("MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected: the message is too large ({text})")
    if name in _REJECTED:
        return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected: {text}")
    if name == "_MSG_TIMED_OUT":
        return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: {text}")
    if name in ("_PURGE_QUEUE", "_PURGE_INFLIGHT"):  # a send beside it got no report in time: the producer was retired
        return AttemptResult(
            failure=FailureKind.TIMEOUT,
            error=f"timeout: withdrawn with its producer, which another send found not answering ({text})",
        )
    if name in _CONNECTION:
        return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {text}")
    return AttemptResult(failure=FailureKind.TRANSPORT, error=text)


def _describe(exc: BaseException) -> str:
    if exc.args and hasattr(exc.args[0], "name"):
        error = exc.args[0]
        return f"{error.name()}: {error.str()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
