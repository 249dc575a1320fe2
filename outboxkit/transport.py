"""The transport interface: how one delivery leaves the process.

A transport is one method, ``send(delivery, idempotency_key=..., timeout=...)
-> AttemptResult``, and ``close()``.  It never raises for a failed delivery; a
timeout or a refused connection is an ``AttemptResult`` with a ``failure``.
``timeout`` is a total deadline: ``send`` returns within ``timeout`` seconds
of being called, whatever the receiver does, because the drain's lease
(``OutboxOptions.minimum_lease``) is sized on it.  A send that outlived it
could still be running when its row's lease ends and another drain claims
the row again.
``HttpTransport`` (in ``outboxkit.http_transport``) is the default;
``CallableTransport`` wraps a function, which is handy in tests and for
non-HTTP receivers.
"""

from __future__ import annotations

import json as jsonlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from outboxkit.policy import AttemptResult, FailureKind

__all__ = ["CallableTransport", "Delivery", "Transport"]

_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "GET"})
# RFC 9110 token characters for names; visible ASCII, space and tab for values.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """What to send for one outbox row.

    ``json`` is serialised with ``json.dumps`` (no NaN); ``headers`` are added
    to every attempt.  ``Idempotency-Key`` is set by the kit and cannot be
    overridden here, so every attempt of a row carries the same key.
    """

    url: str
    method: str = "POST"
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _is_http_url(self.url):
            raise ValueError(f"Delivery.url must be an absolute http(s) URL with a host, got {self.url!r}")
        method = self.method.upper() if isinstance(self.method, str) else self.method
        if method not in _METHODS:
            raise ValueError(f"Delivery.method must be one of {sorted(_METHODS)}, got {self.method!r}")
        object.__setattr__(self, "method", method)
        if not isinstance(self.headers, Mapping):
            raise ValueError(f"Delivery.headers must be a mapping of str to str, got {self.headers!r}")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(f"Delivery.headers must map str to str, got {name!r}: {value!r}")
            if not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
                raise ValueError(f"Delivery.headers has an invalid HTTP header (ASCII, no line breaks): {name!r}: {value!r}")
            if name.lower() == "idempotency-key":
                raise ValueError("Idempotency-Key is set by outboxkit from the row; do not pass it in headers")
        # A private copy: the caller's dict could change after validation.
        object.__setattr__(self, "headers", dict(self.headers))
        try:
            self.body()
        except (TypeError, ValueError) as exc:  # NaN, a cycle: fail in build_delivery, not in the send
            raise ValueError(f"Delivery.json cannot be encoded as JSON: {exc}") from None

    def body(self) -> bytes | None:
        """The encoded JSON body, or None when there is none."""
        if self.json is None:
            return None
        return jsonlib.dumps(self.json, separators=(",", ":"), allow_nan=False, default=str).encode()


def _is_http_url(url: object) -> bool:
    if not isinstance(url, str) or any(character.isspace() or ord(character) < 32 for character in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


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
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)
