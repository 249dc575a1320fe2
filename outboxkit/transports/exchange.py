"""What one HTTP attempt sent and what came back, as the attempt history keeps it: redacted and bounded.

``HttpTransport`` hands every attempt's ``Exchange`` (``outboxkit.results``)
back on its ``AttemptResult``; the drain's attempt history stores it
(``outboxkit.storage.attempts``) and the admin's row page shows it.

Redacted before it leaves the transport, so no secret reaches the history:

* the value of ``Authorization``, ``Proxy-Authorization``, ``Cookie``, the
  Standard Webhooks ``webhook-signature`` and every header whose name says it
  carries a credential (``...-Token``, ``X-Api-Key``, ``...Secret...``,
  ``...Session...``; ``target_secrets.redact_headers`` uses the same words),
  except ``Idempotency-Key``, ``webhook-id`` and ``webhook-timestamp``, which
  the row page shows anyway;
* every header a wrapping transport names (``redacted_headers``): the guarded
  transport of HTTP targets names each header whose value it took from a
  secret of the settings, whatever the header is called;
* the URL's user information (``***``) and the value of every query
  parameter whose name says it carries a credential (``token``, ``key``,
  ``sig``, ``signature``, ``secret``, ``password``...).

Bounded: at most ``MAX_HEADERS`` request headers of at most
``HEADER_VALUE_CHARS`` each, a URL of at most ``URL_CHARS``, a few selected
response headers (``RESPONSE_HEADERS``) and the first
``RESPONSE_EXCERPT_BYTES`` of the answer's body.  The request body is kept
whole here (the transport's own bytes, no copy) with its size and SHA-256;
how much of it the history stores is its setting (``attempt_body_bytes``,
none by default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import urllib.parse
from collections.abc import Collection, Iterable

from outboxkit.results import Exchange
from outboxkit.target_secrets import REDACTED, redact_url

__all__ = [
    "HEADER_VALUE_CHARS",
    "MAX_HEADERS",
    "RESPONSE_EXCERPT_BYTES",
    "RESPONSE_HEADERS",
    "URL_CHARS",
    "capture_request",
    "redact_query",
    "redacted_headers",
    "with_response",
]

MAX_HEADERS = 64
HEADER_VALUE_CHARS = 500
URL_CHARS = 2000
RESPONSE_EXCERPT_BYTES = 1024
# The answer's headers kept: what says what the body is, when to come back, and which request the receiver logged.
RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "retry-after",
        "location",
        "x-request-id",
        "request-id",
        "x-correlation-id",
        "x-amzn-requestid",
        "x-amz-request-id",
        "cf-ray",
    }
)
_ALWAYS_SECRET = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "webhook-signature"})
_SHOWN_ANYWAY = frozenset({"idempotency-key", "webhook-id", "webhook-timestamp"})
_SENSITIVE_HEADER = re.compile(r"auth|token|secret|key|password|passwd|cookie|session|signature|credential", re.IGNORECASE)
_SENSITIVE_PARAMETER = re.compile(
    r"auth|token|secret|key|password|passwd|pwd|session|signature|^sig$|credential", re.IGNORECASE
)


def _secret_header(lowered: str) -> bool:
    if lowered in _ALWAYS_SECRET:
        return True
    return lowered not in _SHOWN_ANYWAY and _SENSITIVE_HEADER.search(lowered) is not None


def _headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    kept: list[tuple[str, str]] = []
    for name, value in headers:
        if len(kept) >= MAX_HEADERS:
            break
        shown = REDACTED if _secret_header(name.lower()) else value[:HEADER_VALUE_CHARS]
        kept.append((name, shown))
    return tuple(kept)


def redact_query(url: str) -> str:
    """``url`` with its user information as ``***`` and each credential-looking query parameter's value redacted."""
    url = redact_url(url)
    parts = urllib.parse.urlsplit(url)
    if not parts.query:
        return url
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if not any(_SENSITIVE_PARAMETER.search(name) for name, _ in pairs):
        return url
    query = "&".join(
        f"{urllib.parse.quote(name, safe='')}="
        + (REDACTED if _SENSITIVE_PARAMETER.search(name) else urllib.parse.quote(value, safe=""))
        for name, value in pairs
    )
    return urllib.parse.urlunsplit(parts._replace(query=query))


def capture_request(method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes | None) -> Exchange:
    """The request part of an attempt's exchange, redacted (see the module)."""
    return Exchange(
        method=method,
        url=redact_query(url)[:URL_CHARS],
        request_headers=_headers(headers),
        body=body,
        body_size=len(body) if body is not None else 0,
        body_sha256=hashlib.sha256(body).hexdigest() if body is not None else None,
    )


def with_response(exchange: Exchange, status: int, headers: Iterable[tuple[bytes, bytes]], content: bytes) -> Exchange:
    """``exchange`` with what came back: the status, the selected headers, the body's first bytes and its size."""
    selected = []
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1")
        if name.lower() in RESPONSE_HEADERS:
            value = raw_value.decode("latin-1")[:HEADER_VALUE_CHARS]
            selected.append((name, redact_query(value) if name.lower() == "location" else value))
    return dataclasses.replace(
        exchange,
        status=status,
        response_headers=tuple(selected),
        response_excerpt=content[:RESPONSE_EXCERPT_BYTES],
        response_size=len(content),
    )


def redacted_headers(exchange: Exchange, names: Collection[str], *, excerpt_bytes: int | None = None) -> Exchange:
    """``exchange`` with the named request headers redacted too, and (``excerpt_bytes``) a shorter body excerpt.

    For a transport that wraps another: it knows which headers it filled from secrets.
    """
    lowered = {name.lower() for name in names}
    headers = tuple((name, REDACTED if name.lower() in lowered else value) for name, value in exchange.request_headers)
    excerpt = exchange.response_excerpt if excerpt_bytes is None else exchange.response_excerpt[:excerpt_bytes]
    return dataclasses.replace(exchange, request_headers=headers, response_excerpt=excerpt)
