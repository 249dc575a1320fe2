"""Rate limits per destination: requests per second that hold across every process (the rules, pure).

An outbox may limit how many requests per second each destination gets
(``OutboxOptions.rate_limit = RateLimit(...)``): the same limit for every
destination (``per_second``), a limit for named ones (``destinations``), or
both.  A destination without a limit costs nothing: no state is read or
written for it.

Each limited destination has a token bucket, one row of
``outboxkit_destination_rates`` shared by every process.  It holds up to
``burst`` tokens (by default one second's worth: ``max(1, per_second *
burst_seconds)``) and refills at ``per_second``; a claimed row takes one.  The
claim itself takes the tokens, in the statement that claims the rows, under
the bucket row's lock (``outboxkit.storage.destination_claim``): rows beyond
the tokens are not claimed, so they keep their attempts and due times, and
two processes never spend the same token.

**Precision.**  Rows are claimed, across every process, at most ``burst +
per_second * T`` in any window of ``T`` seconds (the bucket's refill time
only moves forward, and the claim reads it by the database server's clock in
SQL, so every process counts by the same time).  A claimed row is sent at
once, within the outbox's lease.  Probes (``outboxkit.breaker``) go without a
token: at most ``BreakerOptions.probes`` rows per cool-down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from outboxkit.errors import ConfigurationError

__all__ = ["RateLimit"]

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
