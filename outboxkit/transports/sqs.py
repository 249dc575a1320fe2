"""Amazon SQS delivery on boto3 (the ``sqs`` extra: ``pip install 'outboxkit[sqs]'``).

A row goes to ``sqs://<endpoint host>/<account id>/<queue name>``, the queue's URL with ``sqs`` for its scheme
(``sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo``).  It is sent with ``SendMessage``; the JSON is
the body, each header a string message attribute, and the row's idempotency key the attribute
``Outboxkit-Idempotency-Key``.  On a FIFO queue (a name ending in ``.fifo``) the idempotency key is also the
``MessageDeduplicationId``, so SQS drops a second copy sent within its five-minute de-duplication interval, and
the delivery's ``key`` is the ``MessageGroupId`` (the order is kept per key); a FIFO delivery without a key is
refused before sending.  A standard queue does not de-duplicate: the consumer drops a copy by the attribute.

The outcome rules:

* accepted (``done``) only on the ``MessageId`` SQS answers (it stored the message);
* ``rejected`` (``stuck`` at once): no such queue, a parameter or content SQS refuses (``InvalidParameterValue``,
  ``InvalidMessageContents``, ``MissingParameter``, ``UnsupportedOperation``), and, before sending, a message
  over ``max_message_size`` (body and attributes), more than ten attributes, or a FIFO delivery without a key;
* retried: the endpoint down or unreachable, no answer by the deadline, throttling, SQS's server errors, and
  credentials or permissions refused (they are the transport's, not the message's: the breaker holds the rows,
  attempts kept, until they are fixed), and any other error.

``endpoint_scheme`` is ``https`` for AWS; ``http`` reaches a local server (the tests run ``moto``'s stand-alone
server, which implements AWS's API: it is not AWS).  boto3 is synchronous: each send runs on a thread of the
transport's pool and is waited for at most until its deadline (boto3's own read timeout ends the call soon after).
"""

from __future__ import annotations

import concurrent.futures
import threading
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote, urlsplit

from outboxkit.errors import ConfigurationError, InvalidValueError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery

__all__ = ["SqsTransport"]

INSTALL_HINT = "pip install 'outboxkit[sqs]'"
IDEMPOTENCY_ATTRIBUTE = "Outboxkit-Idempotency-Key"
KEY_ATTRIBUTE = "Outboxkit-Key"
# SQS's limit on a message, body and attributes together, until 2025 (AWS raised it to 1 MiB then): set
# max_message_size to the queue's MaximumMessageSize.
DEFAULT_MAX_MESSAGE_SIZE = 262_144
_MAX_ATTRIBUTES = 10
_REJECTED_CODES = frozenset({
    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "InvalidParameterValue", "InvalidMessageContents",
    "MissingParameter", "UnsupportedOperation", "InvalidAttributeName", "InvalidAttributeValue",
})
_THREADS = 64


def _boto3() -> SimpleNamespace:
    """The one place boto3 (and its botocore) is imported."""
    try:
        import boto3.session
        import botocore.config
        import botocore.exceptions
    except ImportError:
        raise ConfigurationError(f"SqsTransport needs boto3: {INSTALL_HINT}") from None
    return SimpleNamespace(Session=boto3.session.Session, Config=botocore.config.Config, errors=botocore.exceptions)


class SqsTransport:
    """Sends each delivery with ``SendMessage`` and waits for its ``MessageId``; never raises for a failed send.

    ``region`` names the AWS region; ``access_key_id`` and ``secret_access_key`` authenticate (None: boto3's own
    chain of environment, files and instance roles).
    """

    def __init__(
        self,
        *,
        region: str,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        endpoint_scheme: str = "https",
        connect_timeout: float = 2.0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        if endpoint_scheme not in ("https", "http"):
            raise InvalidValueError(f"endpoint_scheme must be 'https' or 'http', got {endpoint_scheme!r}")
        if isinstance(max_message_size, bool) or not isinstance(max_message_size, int) or max_message_size < 1:
            raise InvalidValueError(f"max_message_size must be a positive number of bytes, got {max_message_size!r}")
        self._boto3 = _boto3()
        self._session = self._boto3.Session(
            region_name=region, aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key
        )
        self._scheme = endpoint_scheme
        self._connect_timeout = connect_timeout
        self._max_message_size = max_message_size
        self._clients: dict[tuple[str, float], Any] = {}
        self._lock = threading.Lock()  # clients are made under it (boto3's session is not thread-safe); used freely after
        self._pool = concurrent.futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="outboxkit-sqs")

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        parts = urlsplit(delivery.url)
        if parts.scheme != "sqs":
            return _refused(f"SqsTransport sends sqs:// URLs, got {parts.scheme}://")
        queue = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1])
        request: dict[str, Any] = {
            "QueueUrl": f"{self._scheme}://{parts.netloc}{parts.path}",
            "MessageBody": (delivery.body() or b"null").decode(),
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value}
                for name, value in {**delivery.headers, IDEMPOTENCY_ATTRIBUTE: idempotency_key,
                                    **({KEY_ATTRIBUTE: delivery.key} if delivery.key is not None else {})}.items()
            },
        }
        if queue.endswith(".fifo"):
            if delivery.key is None:
                return _refused(f"the FIFO queue {queue!r} needs a message group: give the Delivery a key")
            request["MessageGroupId"] = delivery.key
            request["MessageDeduplicationId"] = idempotency_key
        problem = self._size_problem(request)
        if problem is not None:
            return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected before sending: {problem}")
        future = self._pool.submit(self._send, parts.netloc, timeout, request, queue)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no answer from SQS within {timeout:g} s")

    def _size_problem(self, request: dict[str, Any]) -> str | None:
        attributes = request["MessageAttributes"]
        if len(attributes) > _MAX_ATTRIBUTES:
            return (f"{len(attributes)} message attributes (the headers, the idempotency key and the key), "
                    f"over SQS's {_MAX_ATTRIBUTES}")
        size = len(request["MessageBody"].encode()) + sum(
            len(name.encode()) + len("String") + len(value["StringValue"].encode()) for name, value in attributes.items()
        )
        if size > self._max_message_size:
            return f"the message ({size:,} bytes with its attributes) is over max_message_size ({self._max_message_size:,})"
        return None

    def _client(self, netloc: str, timeout: float) -> Any:
        with self._lock:
            client = self._clients.get((netloc, timeout))
            if client is None:
                config = self._boto3.Config(
                    connect_timeout=min(self._connect_timeout, timeout), read_timeout=timeout,
                    retries={"total_max_attempts": 1},  # one try per send: the drain's rules retry
                )
                client = self._session.client("sqs", endpoint_url=f"{self._scheme}://{netloc}", config=config)
                self._clients[(netloc, timeout)] = client
            return client

    def _send(self, netloc: str, timeout: float, request: dict[str, Any], queue: str) -> AttemptResult:
        exceptions = self._boto3.errors
        try:
            answer = self._client(netloc, timeout).send_message(**request)
        except exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            text = f"SQS answered {code}: {message}"
            if code in _REJECTED_CODES:
                return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected: {text}")
            return AttemptResult(failure=FailureKind.TRANSPORT, error=text)
        except (exceptions.ReadTimeoutError, exceptions.ConnectTimeoutError) as exc:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: {exc}")
        except (exceptions.EndpointConnectionError, exceptions.ConnectionClosedError) as exc:
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {exc}")
        except exceptions.NoCredentialsError as exc:
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {exc}")
        except exceptions.BotoCoreError as exc:
            return AttemptResult(failure=FailureKind.TRANSPORT, error=f"{type(exc).__name__}: {exc}")
        sequence = f" seq {answer['SequenceNumber']}" if "SequenceNumber" in answer else ""
        return AttemptResult(acknowledgement=f"queue {queue} message {answer['MessageId']}{sequence}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()


def _refused(reason: str) -> AttemptResult:
    return AttemptResult(failure=FailureKind.REFUSED, error=f"refused before sending: {reason}")
