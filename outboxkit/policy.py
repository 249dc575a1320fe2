"""The outcome rules: what one delivery attempt means for its row.

A pure function of (attempt result, attempts so far, now) -> decision, so the
rules are pinned by known-answer tests without a network or a database.

* 2xx: ``done``.
* 408, 429, any 5xx, a timeout, a connection error, an exception raised by the
  application's ``build_delivery``: retry after
  ``backoff[min(attempts - 1, len(backoff) - 1)]`` seconds, or later if the
  receiver's ``Retry-After`` asks for longer.
* Any other status (other 4xx, 3xx, 1xx): ``stuck`` at once; the receiver
  rejected the request and sending it again cannot help.
* A send refused before it left (``refused``: a URL the guard of
  ``outboxkit.url_guard`` does not let through, a secret the settings lack):
  ``stuck`` at once; nothing was sent, and the same row would be refused again.
* A broker's acknowledgement (``acknowledgement``: a JetStream ack's stream
  sequence, a stream entry id): ``done``, like a 2xx.  A message the broker
  answered and will refuse again however often it is sent (``rejected``: over
  its size limit, no stream for a subject): ``stuck`` at once, like a 4xx.
  The rules of each broker are in its transport's docstring
  (``outboxkit.transports.nats``, ``.redis_streams``, ``.rabbitmq``).
* ``attempts >= max_attempts`` after a failed attempt: ``stuck``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

from outboxkit.errors import InvalidValueError
from outboxkit.results import Exchange

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_ATTEMPTS",
    "AttemptResult",
    "Decision",
    "FailureKind",
    "RetryPolicy",
    "parse_retry_after",
]

DEFAULT_BACKOFF: tuple[float, ...] = (5, 15, 60, 300, 900, 3600)
DEFAULT_MAX_ATTEMPTS = 24
RETRYABLE_STATUS_CODES = frozenset({408, 429})


class FailureKind(str, enum.Enum):
    """Why an attempt produced no HTTP response or acknowledgement."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"  # refused, reset, DNS, protocol error
    BUILD = "build"  # the application's build_delivery raised
    TRANSPORT = "transport"  # any other error inside the transport
    REFUSED = "refused"  # refused before sending (outboxkit.transports.guarded); never retried
    REJECTED = "rejected"  # a broker answered and refuses this message whenever it is sent; never retried


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptResult:
    """What one attempt produced: exactly one of an HTTP status, a broker's acknowledgement, or a failure.

    ``acknowledgement`` is what a broker answered when it stored the message
    (``"stream ORDERS seq 42"``, a stream entry id), so an attempt counts as
    accepted only on the broker's word, never because a client library took it.
    """

    status_code: int | None = None
    failure: FailureKind | None = None
    error: str | None = None
    retry_after: str | None = None
    acknowledgement: str | None = None
    # What an HTTP attempt sent and got back, redacted, for the attempt history (None from other transports).
    # Not part of the result's value: two results that say the same are equal whatever was captured.
    exchange: Exchange | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = (self.status_code is not None) + (self.failure is not None) + (self.acknowledgement is not None)
        if given != 1:
            raise InvalidValueError("an AttemptResult has exactly one of a status_code, a failure or an acknowledgement")

    @property
    def answered(self) -> bool:
        """The receiver or broker answered: a status, an acknowledgement, or a refusal of this very message."""
        return self.failure is None or self.failure is FailureKind.REJECTED

    @property
    def succeeded(self) -> bool:
        if self.acknowledgement is not None:
            return True
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass(frozen=True, slots=True)
class Decision:
    """The row's new state after an attempt."""

    status: str  # "done", "pending" (retry) or "stuck"
    next_attempt_at: datetime | None = None
    reason: str = ""


def _is_seconds(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value >= 0
    )


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or HTTP date).

    Returns None for a missing or unparseable header: a malformed hint is
    ignored rather than trusted.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    # isascii: str.isdigit() also accepts digits such as '²' that float() refuses.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment is None:
        return None
    if moment.tzinfo is None:  # RFC 9110 dates are GMT
        moment = moment.replace(tzinfo=timezone.utc)
    return max(0.0, (moment - now).total_seconds())


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Backoff table and attempt limit for one outbox.

    ``backoff`` is in seconds; attempt *n* (1-based) that fails waits
    ``backoff[min(n - 1, len(backoff) - 1)]``.  ``max_retry_after`` caps how
    far a receiver's ``Retry-After`` can push a row (default one day).
    """

    backoff: tuple[float, ...] = field(default=DEFAULT_BACKOFF)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_retry_after: float = 86_400.0

    def __post_init__(self) -> None:
        if isinstance(self.backoff, (str, bytes)) or not isinstance(self.backoff, Iterable):
            raise InvalidValueError(f"backoff must be a sequence of seconds, e.g. (5, 15, 60), got {self.backoff!r}")
        steps = tuple(self.backoff)
        if not steps:
            raise InvalidValueError("backoff needs at least one step, e.g. (5, 15, 60)")
        if any(not _is_seconds(step) for step in steps):
            raise InvalidValueError(f"backoff steps must be finite seconds >= 0, got {self.backoff!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidValueError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        if not _is_seconds(self.max_retry_after):
            raise InvalidValueError(f"max_retry_after must be finite seconds >= 0, got {self.max_retry_after!r}")
        object.__setattr__(self, "backoff", tuple(float(step) for step in steps))
        object.__setattr__(self, "max_retry_after", float(self.max_retry_after))

    def delay_for(self, attempts: int) -> float:
        """Seconds to wait after failed attempt number ``attempts`` (1-based)."""
        index = min(max(attempts, 1) - 1, len(self.backoff) - 1)
        return self.backoff[index]

    def is_retryable(self, result: AttemptResult) -> bool:
        if result.acknowledgement is not None:
            return False
        if result.failure is not None:
            return result.failure not in (FailureKind.REFUSED, FailureKind.REJECTED)
        code = result.status_code
        assert code is not None
        return code in RETRYABLE_STATUS_CODES or 500 <= code <= 599

    def status_for(self, result: AttemptResult, *, attempts: int) -> str:
        """The status the outcome rules give: ``done``, ``stuck`` or ``pending`` (``decide`` without the times)."""
        if result.succeeded:
            return "done"
        if not self.is_retryable(result) or attempts >= self.max_attempts:
            return "stuck"
        return "pending"

    def decide(self, result: AttemptResult, *, attempts: int, now: datetime) -> Decision:
        """Apply the outcome rules.  ``attempts`` counts the attempt just made."""
        status = self.status_for(result, attempts=attempts)
        if status == "done":
            if result.acknowledgement is not None:
                return Decision("done", reason=f"acknowledged: {result.acknowledgement}")
            return Decision("done", reason=f"HTTP {result.status_code}")
        if status == "stuck":
            if result.failure is FailureKind.REFUSED:
                return Decision("stuck", reason="refused before sending; not retried")
            if not self.is_retryable(result):
                return Decision("stuck", reason="rejected by the receiver; not retried")
            return Decision("stuck", reason=f"max attempts ({self.max_attempts}) reached")
        delay = self.delay_for(attempts)
        asked = parse_retry_after(result.retry_after, now)
        if asked is not None and asked > delay:
            # The cap bounds how far a receiver may push the row, never below the table.
            delay = max(delay, min(asked, self.max_retry_after))
        return Decision("pending", next_attempt_at=now + timedelta(seconds=delay), reason=f"retry in {delay:g}s")
