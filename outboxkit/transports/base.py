"""The transport interface: how one delivery leaves the process.

A transport is one method, ``send(delivery, idempotency_key=..., timeout=...)
-> AttemptResult``, and ``close()``.  It never raises for a failed delivery; a
timeout or a refused connection is an ``AttemptResult`` with a ``failure``.
``timeout`` is a total deadline: ``send`` returns within ``timeout`` seconds
of being called, whatever the receiver does, because the drain's lease
(``OutboxOptions.minimum_lease``) is sized on it.  A send that outlived it
could still be running when its row's lease ends and another drain claims
the row again.
``HttpTransport`` (in ``outboxkit.transports.http``) is the default;
``CallableTransport`` wraps a function, which is handy in tests and for
non-HTTP receivers.

A delivery to a broker is the same ``Delivery``, addressed by a URL whose
scheme names the broker and whose path names the target, so its destination
(scheme, host and port) and everything the drain does with it (retries, the
breaker, caps, ordering, replay, the admin, metrics) are those of any row:

==========================================  ====================================
``nats://127.0.0.1:4222/orders.created``    JetStream subject ``orders.created``
                                            (``outboxkit.transports.nats``)
``redis://127.0.0.1:6379/0/orders``         stream ``orders`` of database 0
                                            (``outboxkit.transports.redis_streams``)
``amqp://127.0.0.1:5672/%2F?exchange=orders  exchange ``orders``, routing key
&routing_key=created``                      ``created``, vhost ``/``
                                            (``outboxkit.transports.rabbitmq``)
``sqs://sqs.eu-west-1.amazonaws.com/        SQS queue ``orders.fifo`` of account
123456789012/orders.fifo``                  123456789012 (``outboxkit.transports.sqs``)
``kafka://127.0.0.1:9092/orders``           Kafka topic ``orders``, bootstrap server
                                            127.0.0.1:9092 (``outboxkit.transports.kafka``)
==========================================  ====================================

A broker URL carries no credentials (they would be shown wherever the URL
is: traces, logs); they are given to the broker's transport.  ``method`` means
nothing to a broker; ``headers`` become the message's headers; ``key`` is the
message key (the ordering or partition key), sent with the message.  The row's
idempotency key is the broker's de-duplication id.

``Delivery.json`` is encoded once, when the ``Delivery`` is built (so a value
that cannot be sent fails inside ``build_delivery``, with the path of the
offending field), by these rules:

==========================  ===============================================
Python value                JSON
==========================  ===============================================
``dict`` / ``Mapping``      object (keys: str, int, float, bool, None, or an
                            ``Enum`` whose value is one of those)
``list``, ``tuple``         array
``str``, ``int``, ``bool``  as themselves; ``float`` too, but NaN and
``None``, ``float``         infinities are refused
aware ``datetime``          ISO 8601 string with its offset,
                            ``"2030-01-01T12:00:00+00:00"``
naive ``datetime``          refused: its time zone is unknown (attach one,
                            e.g. ``tzinfo=timezone.utc``)
``date``, ``time``          ISO 8601 string (``"2030-01-01"``, ``"09:30:00"``)
``uuid.UUID``               its canonical string
``decimal.Decimal``         a string of exactly its digits, fixed point:
                            ``Decimal("10.50")`` -> ``"10.50"``; a JSON
                            number would be read back as a binary float
``enum.Enum``               its ``value``, encoded by these same rules
==========================  ===============================================

Anything else (``set``, ``bytes``, ``timedelta``, a dataclass, a pydantic
model...) is refused with an ``InvalidDeliveryError`` (a ``ValueError``) that
names the field, e.g. ``Delivery.json['items'][2]['price']``; convert it
yourself (``sorted(...)``, ``base64``, ``model.model_dump(mode="json")``).
"""

from __future__ import annotations

import json as jsonlib
import math
import operator
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import date, datetime, time
from decimal import Decimal
from enum import Enum
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from outboxkit.errors import InvalidDeliveryError, InvalidValueError
from outboxkit.policy import AttemptResult, FailureKind

__all__ = ["BROKER_SCHEMES", "CallableTransport", "Delivery", "Transport"]

# The URL schemes of the broker transports (outboxkit.transports.nats, .redis_streams, .rabbitmq, .sqs, .kafka).
BROKER_SCHEMES = frozenset({"nats", "redis", "rediss", "amqp", "amqps", "sqs", "kafka"})
_KEY_LIMIT = 1024

_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "GET"})
# RFC 9110 token characters for names; visible ASCII, space and tab for values.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Headers that frame or route the request, or belong to one hop of it: the
# transport sets Host and Content-Length itself, and a second framing in a
# delivery's headers would let a keep-alive receiver read part of the body as
# another request.  Any ``Proxy-*`` header is refused too.
FRAMING_HEADERS = frozenset(
    {"transfer-encoding", "content-length", "connection", "upgrade", "host", "keep-alive", "te", "trailer"}
)


def framing_header_problem(name: str) -> str | None:
    """Why ``name`` may not be set by a delivery, or None (the kit's rule for every header it is handed)."""
    lowered = name.lower()
    if lowered in FRAMING_HEADERS or lowered.startswith("proxy-"):
        return (
            f"may not set {name!r}: it frames or routes the request (Host, Content-Length and the hop-by-hop headers "
            "Transfer-Encoding, Connection, Upgrade, Keep-Alive, TE, Trailer, Proxy-* are the transport's)"
        )
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """What to send for one outbox row.

    ``json`` is encoded once, here, by the rules in this module's docstring
    (aware datetimes as ISO 8601, Decimal as an exact string, Enum by value;
    anything else is refused with its field named); ``headers`` are added
    to every attempt, except those that frame or route the request
    (``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection``,
    ``Upgrade``, ``Keep-Alive``, ``TE``, ``Trailer``, ``Proxy-*``), which
    are refused.  ``Idempotency-Key`` is set by the kit and cannot be
    overridden here, so every attempt of a row carries the same key.

    ``url`` is an http(s) URL, or a broker's (``nats://host:port/subject``,
    ``redis://host:port/db/stream``, ``amqp://host:port/vhost?exchange=...``:
    this module's docstring) without
    credentials.  ``key`` is the message key a broker is sent (the ordering
    or partition key, up to 1024 characters); an HTTP send ignores it.
    """

    url: str
    method: str = "POST"
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None
    # The encoded body, fixed at construction: what was checked is what is sent,
    # even if the caller's dict changes afterwards.
    _body: bytes | None = field(init=False, repr=False, compare=False, default=None)
    # The address a guard checked (outboxkit.url_guard), set by pinned_to; None: the transport resolves the host.
    _address: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not _is_http_url(self.url):
            problem = _broker_url_problem(self.url)
            if problem is not None:
                raise InvalidDeliveryError(problem)
        if self.key is not None and (not isinstance(self.key, str) or not 0 < len(self.key) <= _KEY_LIMIT):
            raise InvalidDeliveryError(
                f"Delivery.key must be a non-empty str of at most {_KEY_LIMIT} characters, got {self.key!r}"
            )
        method = self.method.upper() if isinstance(self.method, str) else self.method
        if method not in _METHODS:
            raise InvalidDeliveryError(f"Delivery.method must be one of {sorted(_METHODS)}, got {self.method!r}")
        object.__setattr__(self, "method", method)
        if not isinstance(self.headers, Mapping):
            raise InvalidDeliveryError(f"Delivery.headers must be a mapping of str to str, got {self.headers!r}")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise InvalidDeliveryError(f"Delivery.headers must map str to str, got {name!r}: {value!r}")
            if not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
                raise InvalidDeliveryError(
                    f"Delivery.headers has an invalid HTTP header (ASCII, no line breaks): {name!r}: {value!r}"
                )
            framing = framing_header_problem(name)
            if framing is not None:
                raise InvalidDeliveryError(f"Delivery.headers {framing}")
            if name.lower() == "idempotency-key":
                raise InvalidDeliveryError("Idempotency-Key is set by outboxkit from the row; do not pass it in headers")
        # A private copy: the caller's dict could change after validation.
        object.__setattr__(self, "headers", dict(self.headers))
        if self.json is not None:  # fail in build_delivery, not in the send
            object.__setattr__(self, "_body", encode_json(self.json))

    def body(self) -> bytes | None:
        """The encoded JSON body, or None when there is none."""
        return self._body

    @property
    def address(self) -> str | None:
        """The IP address this delivery must be sent to (``pinned_to``), or None: the transport resolves the URL's host."""
        return self._address

    def pinned_to(self, address: str) -> Delivery:
        """A copy sent to ``address`` (an IP a guard checked), with the URL's own host name in ``Host`` and TLS.

        ``HttpTransport`` connects to that address instead of resolving the
        host again, so a name that resolves elsewhere after the check (DNS
        rebinding) is never reached; a transport of your own should do the same.
        """
        copy = self.with_headers({})
        object.__setattr__(copy, "_address", address)
        return copy

    def with_headers(self, extra: Mapping[str, str]) -> Delivery:
        """A copy carrying ``extra`` headers, which replace any of the same name (in any letter case).

        For the kit's own headers (trace context, webhook signatures), which
        are plain ASCII: they are not validated again, and the body is not
        encoded again.  This delivery is left as it was.
        """
        replaced = {name.lower() for name in extra}
        copy = object.__new__(Delivery)
        for name, value in zip(_DELIVERY_FIELDS, _delivery_values(self), strict=True):
            object.__setattr__(copy, name, value)
        headers = {name: value for name, value in self.headers.items() if name.lower() not in replaced}
        object.__setattr__(copy, "headers", {**headers, **extra})
        return copy


_DELIVERY_FIELDS = tuple(item.name for item in fields(Delivery))
_delivery_values = operator.attrgetter(*_DELIVERY_FIELDS)


def encode_json(value: object) -> bytes:
    """Encode a delivery body by the rules in this module's docstring; an ``InvalidDeliveryError`` names a bad field."""
    try:  # plain data (the common case) goes straight through the C encoder
        return _dumps(value)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        plain = _plain(value, "Delivery.json", set())
    except RecursionError:
        raise InvalidDeliveryError("Delivery.json cannot be encoded as JSON: it is nested too deeply") from None
    except InvalidDeliveryError as exc:
        raise InvalidDeliveryError(f"Delivery.json cannot be encoded as JSON: {exc}") from None
    return _dumps(plain)


def _dumps(value: object) -> bytes:
    return jsonlib.dumps(value, separators=(",", ":"), allow_nan=False).encode()


_SCALARS = (str, int, type(None))  # bool is an int
_KEYS = (str, int, float, type(None))


def _plain(value: object, path: str, seen: set[int]) -> object:
    """``value`` with every supported type replaced by its JSON form; refuses the rest, naming ``path``."""
    if isinstance(value, Enum):
        return _plain(value.value, path, seen)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidDeliveryError(f"{path} is {value!r}; JSON has no NaN or infinity")
        return value
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidDeliveryError(
                f"{path} is a naive datetime ({value.isoformat()}), so its time zone is unknown; "
                "give it one (e.g. tzinfo=timezone.utc)"
            )
        return value.isoformat()
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidDeliveryError(f"{path} is Decimal({str(value)!r}); JSON has no NaN or infinity")
        return format(value, "f")
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in seen:
            raise InvalidDeliveryError(f"{path} contains itself (a circular reference)")
        seen.add(id(value))
        try:
            if isinstance(value, Mapping):
                return {_key(key, path): _plain(item, f"{path}[{key!r}]", seen) for key, item in value.items()}
            return [_plain(item, f"{path}[{index}]", seen) for index, item in enumerate(value)]
        finally:
            seen.discard(id(value))
    hints: dict[type, str] = {
        set: "make it a list (sorted(...))",
        frozenset: "make it a list (sorted(...))",
        bytes: "decode or base64 it",
    }
    hint = hints.get(type(value), "convert it to a JSON type in build_delivery")
    raise InvalidDeliveryError(f"{path} is a {type(value).__name__}, which outboxkit does not encode as JSON; {hint}")


def _key(key: object, path: str) -> object:
    plain = key.value if isinstance(key, Enum) else key
    if not isinstance(plain, _KEYS):
        raise InvalidDeliveryError(f"{path} has a key {key!r} of type {type(key).__name__}; JSON object keys are strings")
    return plain


def _is_http_url(url: object) -> bool:
    return isinstance(url, str) and _is_http_url_text(url)


@lru_cache(maxsize=1024)
def _is_http_url_text(url: str) -> bool:
    # A pure function of the string, asked once per delivery built, and an outbox
    # sends to few distinct URLs: the character scan and urlsplit were a visible
    # share of the drain's per-row CPU (docs/performance.md).
    if any(character.isspace() or ord(character) < 32 for character in url):
        return False
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _broker_url_problem(url: object) -> str | None:
    """Why ``url`` is neither an http(s) URL nor a broker's, or None when it is a broker's."""
    expected = (
        f"Delivery.url must be an absolute http(s) URL with a host, or a broker's "
        f"({', '.join(sorted(BROKER_SCHEMES))}://host:port/target), got {url!r}"
    )
    if not isinstance(url, str) or any(character.isspace() or ord(character) < 32 for character in url):
        return expected
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return expected
    if parts.scheme not in BROKER_SCHEMES or not parts.hostname or not parts.path.strip("/"):
        return expected
    if parts.username is not None or parts.password is not None:
        return (
            f"Delivery.url may not carry credentials ({parts.scheme}://user:password@...): the URL is shown in traces "
            "and logs; give them to the broker's transport"
        )
    return None


def is_broker_url(url: str) -> bool:
    """The URL's scheme is a broker's (``BROKER_SCHEMES``)."""
    return url.split(":", 1)[0].lower() in BROKER_SCHEMES


@runtime_checkable
class Transport(Protocol):
    """Sends a delivery and reports what happened; never raises for a failed send.

    ``send`` must return within ``timeout`` seconds (the whole attempt: name
    lookup, connect, request and the complete answer); the lease relies on
    it.  An attempt that cannot finish in time returns a ``timeout`` failure.
    """

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult: ...

    def close(self) -> None: ...


class CallableTransport:
    """A transport backed by a function ``(delivery, idempotency_key) -> int | AttemptResult``.

    An ``int`` is taken as the HTTP status code.  An exception raised by the
    function becomes a ``transport`` failure, which the policy retries.
    """

    def __init__(self, handler: Callable[[Delivery, str], int | AttemptResult]) -> None:
        self._handler = handler

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        try:
            answer = self._handler(delivery, idempotency_key)
        except Exception as exc:  # the handler is user code; record, do not raise
            return AttemptResult(failure=FailureKind.TRANSPORT, error=f"{type(exc).__name__}: {exc}")
        if isinstance(answer, AttemptResult):
            return answer
        return AttemptResult(status_code=int(answer))

    def close(self) -> None:
        return None


def validate_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)
