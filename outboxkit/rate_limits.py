"""Rate limits per destination: requests per second that hold across every process (the rules, pure).

An outbox may limit how many requests per second each destination gets
(``OutboxOptions.rate_limit = RateLimit(...)``): the same limit for every
destination (``per_second``), a limit for named ones (``destinations``), or
both.  A destination without a limit costs nothing: no state is read or
written for it.

Each limited destination has a token bucket, one row of
``outboxkit_destination_rates`` shared by every process
(``outboxkit.destinations.rate_store``).  It holds up to ``burst`` tokens (by
default one second's worth: ``max(1, per_second * burst_seconds)``) and
refills at ``per_second``; a send takes one.  A drainer takes the tokens for
a claimed batch's rows of that destination in one short transaction under the
row's lock, so two processes never spend the same token.  The rows it gets no
token for are given back unsent, their attempt not spent, due again at the
times the bucket will have a token for them: spread ``1 / per_second`` apart
(in steps of at least ``STEP_SECONDS``) after those already given back, so
each comes back about when its turn comes instead of all at once.

**Precision.**  Tokens are granted, across every process, at most ``burst +
per_second * T`` in any window of ``T`` seconds (the bucket's refill time
only moves forward; the drain counts it by the database server's clock, as
each process reads it, so two processes' times differ by milliseconds and
a process whose reading is ``s`` seconds ahead lets at most
``per_second * s`` more through, once).  A send follows its grant within ``GRANT_SECONDS``: a row
whose send thread starts later than that is given back unsent instead.  So
the requests a destination receives in any window of ``T`` seconds are at
most ``burst + per_second * (T + GRANT_SECONDS)``: with the default burst,
2.5 times the limit in the one second after an idle spell, and within 5% of
it over 30 seconds.  A probe (``outboxkit.breaker``) is sent without a
token: one request per cool-down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from outboxkit.errors import ConfigurationError

__all__ = ["GRANT_SECONDS", "STEP_SECONDS", "Bucket", "RateLimit", "Take", "take"]

# A send must start within this long of its token's grant, or its row is given back unsent.
GRANT_SECONDS = 0.5
# Rows given back for want of a token come due in steps at least this far apart, so a
# high limit does not wake the drain for every single row.
STEP_SECONDS = 0.1
# Absorbs float rounding in the bucket: 0.9999999999 tokens are one.
_EPSILON = 1e-9


def _rate(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number of requests per second, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """Requests per second per destination (``OutboxOptions.rate_limit``); see the module docstring.

    ``per_second``: the limit of every destination of the outbox (None: only
    those named in ``destinations`` are limited).  ``destinations``: limits
    of named destinations (``scheme://host:port``, or the names
    ``Outbox.destination_for`` returns), which replace ``per_second`` for
    them.  ``burst_seconds`` (default 1): how many seconds' worth of
    requests an idle destination may receive at once (at least one request).
    """

    per_second: float | None = None
    destinations: Mapping[str, float] = field(default_factory=dict)
    burst_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.per_second is not None:
            object.__setattr__(self, "per_second", _rate(self.per_second, "RateLimit.per_second"))
        if not isinstance(self.destinations, Mapping):
            raise ConfigurationError(
                f"RateLimit.destinations must map destination names to requests per second, got {self.destinations!r}"
            )
        limits = {}
        for name, value in self.destinations.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"RateLimit.destinations: a destination name must be a non-empty string, got {name!r}")
            limits[name] = _rate(value, f"RateLimit.destinations[{name!r}]")
        object.__setattr__(self, "destinations", limits)
        if self.per_second is None and not limits:
            raise ConfigurationError(
                "RateLimit limits nothing: give per_second (every destination), destinations (named ones), or both"
            )
        seconds = self.burst_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
            raise ConfigurationError(f"RateLimit.burst_seconds must be a positive number of seconds, got {seconds!r}")

    def per_second_of(self, destination: str) -> float | None:
        """The limit of ``destination`` in requests per second, or None if it has none."""
        return self.destinations.get(destination, self.per_second)

    def burst_of(self, per_second: float) -> float:
        """The bucket's size for a limit: ``burst_seconds`` of requests, at least one."""
        return max(1.0, per_second * self.burst_seconds)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One destination's bucket as stored: tokens left at ``refilled_at``, and how far given-back rows are spread."""

    tokens: float
    refilled_at: datetime
    deferred_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Take:
    """``take``'s answer: tokens granted, the due time of each row that got none (in order), and the bucket after."""

    granted: int
    later: list[datetime]
    bucket: Bucket


def take(bucket: Bucket | None, wanted: int, *, now: datetime, per_second: float, burst: float) -> Take:
    """Take up to ``wanted`` tokens from ``bucket`` (None: a new, full one) at ``now``."""
    if bucket is None:
        bucket = Bucket(tokens=burst, refilled_at=now)
    elapsed = max(0.0, (now - bucket.refilled_at).total_seconds())
    tokens = min(burst, bucket.tokens + elapsed * per_second)
    refilled_at = max(bucket.refilled_at, now)  # a clock behind the others' adds nothing
    granted = max(0, min(wanted, math.floor(tokens + _EPSILON)))
    tokens = max(0.0, tokens - granted)
    over = wanted - granted
    deferred_until = bucket.deferred_until if bucket.deferred_until is not None and bucket.deferred_until > now else None
    later: list[datetime] = []
    if over:
        next_token = refilled_at + timedelta(seconds=max(0.0, 1.0 - tokens) / per_second)
        start = max(next_token, deferred_until) if deferred_until is not None else next_token
        step = max(1.0 / per_second, STEP_SECONDS)
        per_step = max(1, round(step * per_second))
        later = [start + timedelta(seconds=(index // per_step) * step) for index in range(over)]
        deferred_until = start + timedelta(seconds=math.ceil(over / per_step) * step)
    return Take(granted, later, Bucket(tokens=tokens, refilled_at=refilled_at, deferred_until=deferred_until))
