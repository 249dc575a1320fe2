"""Destinations: where a delivery goes, and the circuit breaker that contains its failures.

A row's destination is a short name for where its delivery goes.  By default
it is the URL's scheme, host and port (``https://billing.internal:443``), so
every path of one receiver shares one destination; an outbox may name its
destinations itself (per tenant, per partner) by overriding
``Outbox.destination_for(delivery)``.

Each destination of each outbox has a state, shared by every process through
the table ``outboxkit_destinations`` (``outboxkit.destinations.store``).  This
module holds the rules, as pure functions of (state, what an attempt said,
now), so they are pinned by known-answer tests:

* ``healthy``: rows are sent.  A run of ``BreakerOptions.failures``
  consecutive failures (a timeout, a connection error, 408 or any 5xx)
  opens the breaker once no success has come for ``failure_span`` seconds:
  a dead destination opens, a flaky one (failing some requests at random,
  so runs of failures sit between recent successes) stays healthy and its
  rows retry on their own backoff.  A success, or any answer that is not a
  failure (a 4xx: the receiver is there and answering), ends the run.
* ``open``: rows are not claimed and keep their attempts; they wait until
  ``next_probe_at``, ``cool_down`` seconds after the opening.
* ``half_open``: the cool-down is over and one row, the probe, is being sent
  (at most one probe per destination across every process: the claim's
  conditional UPDATE decides who sends it, ``outboxkit.storage.destination_claim``).
  Its success closes the breaker and the waiting rows flow at once; its
  failure re-opens it with the cool-down doubled (up to ``max_cool_down``),
  and the next probe comes up to ``PROBE_JITTER`` of that cool-down sooner,
  by a fraction that changes with every re-opening (a hash of the
  destination and its failure count, so the rule stays a pure function):
  probes at one fixed interval would keep landing in the same phase of a
  receiver that fails on a cycle of that length.
  A probe whose outcome never comes (its worker died) lets another probe go
  when its lease ends.
* ``disabled``: the receiver answered ``410 Gone`` (the Standard Webhooks
  convention for "stop sending"); nothing is sent until a person resumes it.

Besides the state, ``429 Too Many Requests`` and ``503`` with a
``Retry-After`` slow the destination as a whole: none of its rows is sent
before the time asked for (capped at ``max_slow_down``), not only the row that
was answered, and no probe goes before it either.  A slow-down that has
passed is cleared by the next outcome.

Counts of recent outcomes (successes and failures in the current window of
``window`` seconds) give the failure rate operators see.
"""

from __future__ import annotations

import enum
import math
import zlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from urllib.parse import urlsplit

from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult, FailureKind, parse_retry_after

__all__ = [
    "BreakerOptions",
    "DestinationState",
    "Signal",
    "after_outcome",
    "destination_of",
    "signal_of",
]

# The longest destination name kept (the table's column); longer names are refused.
DESTINATION_NAME_LIMIT = 300
_DEFAULT_PORTS = {
    "http": 80, "https": 443, "nats": 4222, "redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671, "sqs": 443,
    "kafka": 9092,
}


@lru_cache(maxsize=4096)
def destination_of(url: str) -> str:
    """The default destination of a URL: ``scheme://host:port``, lower case, the port always written."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
    return f"{parts.scheme.lower()}://{host}:{port}"


def check_destination_name(name: object) -> str:
    """A destination name as returned by ``Outbox.destination_for``: a non-empty string of bounded size."""
    if not isinstance(name, str) or not name or len(name) > DESTINATION_NAME_LIMIT:
        raise ConfigurationError(
            f"a destination must be a non-empty string of at most {DESTINATION_NAME_LIMIT} characters, got {name!r}"
        )
    return name


def _positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# After a failed probe, the next comes up to this share of the cool-down sooner (see the module docstring).
PROBE_JITTER = 0.25

@dataclass(frozen=True, kw_only=True, slots=True)
class BreakerOptions:
    """An outbox's breaker thresholds (``OutboxOptions.breaker``); the defaults are documented in docs/destinations.md.

    ``failures``: consecutive failures that open the breaker (default 5),
    once no success has come for ``failure_span`` seconds (default 10).
    ``cool_down``: seconds from opening to the first probe (default 30);
    each failed probe doubles it, up to ``max_cool_down`` (default 600).
    ``window``: seconds over which recent outcomes are counted (default 300).
    ``max_slow_down``: the longest a ``Retry-After`` may hold a whole
    destination (default 3600).
    ``probes``: rows sent at once when the cool-down is over (default 3;
    across every process).
    """

    failures: int = 5
    failure_span: float = 10.0
    cool_down: float = 30.0
    max_cool_down: float = 600.0
    window: float = 300.0
    max_slow_down: float = 3600.0
    probes: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int) or not 1 <= self.failures <= 1_000_000:
            raise ConfigurationError(f"BreakerOptions.failures must be an integer from 1 to 1000000, got {self.failures!r}")
        if isinstance(self.probes, bool) or not isinstance(self.probes, int) or not 1 <= self.probes <= 1000:
            raise ConfigurationError(f"BreakerOptions.probes must be an integer from 1 to 1000, got {self.probes!r}")
        if isinstance(self.failure_span, bool) or not isinstance(self.failure_span, (int, float)) or not (
            math.isfinite(self.failure_span) and self.failure_span >= 0
        ):
            raise ConfigurationError(f"BreakerOptions.failure_span must be a number of seconds >= 0, got {self.failure_span!r}")
        for name in ("cool_down", "max_cool_down", "window", "max_slow_down"):
            value = getattr(self, name)
            if not _positive(value):
                raise ConfigurationError(f"BreakerOptions.{name} must be a positive number of seconds, got {value!r}")
        if self.max_cool_down < self.cool_down:
            raise ConfigurationError(
                f"BreakerOptions.max_cool_down ({self.max_cool_down:g}) must be at least cool_down ({self.cool_down:g})"
            )


class Signal(str, enum.Enum):
    """What one attempt says about its destination."""

    SUCCESS = "success"  # an answer that is not a failure: 2xx, 4xx other than 408, 410, 429, a broker's ack or rejection
    FAILURE = "failure"  # a timeout, a connection or transport error, 408, any 5xx
    GONE = "gone"  # 410: the receiver asks never to be sent to again
    THROTTLED = "throttled"  # 429: the receiver is there but asks to slow down


@dataclass(frozen=True, slots=True)
class Reading:
    """``signal_of``'s answer: the signal, and how long the whole destination should wait (``Retry-After``)."""

    signal: Signal
    slow_down: float | None = None


def signal_of(attempt: AttemptResult, *, now: datetime) -> Reading | None:
    """What ``attempt`` says about its destination; None when it says nothing (``build_delivery`` raised)."""
    if attempt.acknowledgement is not None or attempt.failure is FailureKind.REJECTED:
        # A broker that acknowledged, or answered to refuse one message, is there and answering (like a 4xx).
        return Reading(Signal.SUCCESS)
    if attempt.failure is not None:
        # Nothing was sent: a build failure or a refusal says nothing about the destination.
        return None if attempt.failure in (FailureKind.BUILD, FailureKind.REFUSED) else Reading(Signal.FAILURE)
    code = attempt.status_code
    assert code is not None
    if code == 410:
        return Reading(Signal.GONE)
    if code == 429 or code == 503:
        slow = parse_retry_after(attempt.retry_after, now)
        return Reading(Signal.THROTTLED if code == 429 else Signal.FAILURE, slow if slow else None)
    if code == 408 or 500 <= code <= 599:
        return Reading(Signal.FAILURE)
    return Reading(Signal.SUCCESS)


class Status(str, enum.Enum):
    HEALTHY = "healthy"
    OPEN = "open"
    HALF_OPEN = "half_open"
    DISABLED = "disabled"


STATUSES = tuple(status.value for status in Status)


@dataclass(frozen=True, kw_only=True, slots=True)
class DestinationState:
    """One destination of one outbox, as stored in ``outboxkit_destinations``."""

    outbox: str
    destination: str
    status: str = Status.HEALTHY.value
    consecutive_failures: int = 0
    window_started_at: datetime | None = None
    window_successes: int = 0
    window_failures: int = 0
    opened_at: datetime | None = None
    cool_down: float | None = None
    next_probe_at: datetime | None = None
    probe_row_id: int | None = None
    probe_until: datetime | None = None
    slowed_until: datetime | None = None
    last_error: str | None = None
    last_status_code: int | None = None
    last_failure_at: datetime | None = None
    last_success_at: datetime | None = None
    changed_by: str | None = None

    def blocked(self, now: datetime) -> bool:
        """Whether its rows are not claimed now (the claim's rule, ``outboxkit.storage.destination_claim.BLOCKED``)."""
        return self.status != Status.HEALTHY.value or (self.slowed_until is not None and self.slowed_until > now)

    @property
    def failure_rate(self) -> float | None:
        """Failures among the recent outcomes, 0 to 1; None before any."""
        total = self.window_successes + self.window_failures
        return self.window_failures / total if total else None


def after_outcome(
    state: DestinationState,
    reading: Reading,
    *,
    now: datetime,
    row_id: int,
    error: str | None,
    status_code: int | None,
    options: BreakerOptions,
    claimed_until: datetime | None = None,
) -> DestinationState:
    """The state after one attempt of row ``row_id`` (claimed until ``claimed_until``) said ``reading``."""
    if state.window_started_at is None or (now - state.window_started_at).total_seconds() >= options.window:
        state = replace(state, window_started_at=now, window_successes=0, window_failures=0)
    if state.slowed_until is not None and state.slowed_until <= now:
        state = replace(state, slowed_until=None)  # passed: the state is quiet again
    if reading.slow_down is not None:
        until = now + timedelta(seconds=min(reading.slow_down, options.max_slow_down))
        if state.slowed_until is None or until > state.slowed_until:
            state = replace(state, slowed_until=until)
    signal = reading.signal
    if signal in (Signal.SUCCESS, Signal.THROTTLED):
        state = replace(state, consecutive_failures=0, window_successes=state.window_successes + 1, last_success_at=now)
        if state.status in (Status.OPEN.value, Status.HALF_OPEN.value):
            return _closed(state)
        return state
    state = replace(
        state,
        last_error=error,
        last_status_code=status_code,
        last_failure_at=now,
        window_failures=state.window_failures + 1,
    )
    if signal is Signal.GONE:
        if state.status == Status.DISABLED.value:
            return state
        return replace(
            state,
            status=Status.DISABLED.value,
            opened_at=now,
            cool_down=None,
            next_probe_at=None,
            probe_row_id=None,
            probe_until=None,
            changed_by="receiver: HTTP 410 Gone",
        )
    state = replace(state, consecutive_failures=state.consecutive_failures + 1)
    succeeded_lately = state.last_success_at is not None and (now - state.last_success_at).total_seconds() < options.failure_span
    if state.status == Status.HEALTHY.value and state.consecutive_failures >= options.failures and not succeeded_lately:
        reason = f"{state.consecutive_failures} consecutive failures"
        return _opened(state, now=now, cool_down=options.cool_down, opened_at=now, reason=reason)
    if state.status == Status.HALF_OPEN.value and _a_probe(state, row_id, claimed_until):
        cool_down = min((state.cool_down or options.cool_down) * 2, options.max_cool_down)
        return _opened(
            state, now=now, cool_down=cool_down, opened_at=state.opened_at or now, reason=f"probe row {row_id} failed",
            sooner=PROBE_JITTER * _spread(state.destination, state.consecutive_failures),
        )
    return state


def _a_probe(state: DestinationState, row_id: int, claimed_until: datetime | None) -> bool:
    """Whether the row was one of the probes: claimed by the probes' claim (whose lease is ``probe_until``) or later,
    not a row sent before the breaker opened."""
    if claimed_until is None or state.probe_until is None:
        return state.probe_row_id == row_id
    return claimed_until >= state.probe_until


def _spread(destination: str, failures: int) -> float:
    """A fraction in [0, 1) that is the same for the same (destination, failure count) and scattered across them."""
    return zlib.crc32(f"{destination}\0{failures}".encode()) / 2**32


def _opened(
    state: DestinationState, *, now: datetime, cool_down: float, opened_at: datetime, reason: str, sooner: float = 0.0
) -> DestinationState:
    next_probe_at = now + timedelta(seconds=cool_down * (1 - sooner))
    return replace(
        state,
        status=Status.OPEN.value,
        opened_at=opened_at,
        cool_down=cool_down,
        next_probe_at=next_probe_at,
        probe_row_id=None,
        probe_until=None,
        changed_by=reason,
    )


def _closed(state: DestinationState) -> DestinationState:
    return replace(
        state,
        status=Status.HEALTHY.value,
        opened_at=None,
        cool_down=None,
        next_probe_at=None,
        probe_row_id=None,
        probe_until=None,
        changed_by=None,
    )


def resumed(state: DestinationState, *, actor: str) -> DestinationState:
    """A person resumed the destination: healthy, its failure run and slow-down forgotten, its rows claimable again."""
    return replace(_closed(state), consecutive_failures=0, slowed_until=None, changed_by=f"resumed by {actor}")


def disabled(state: DestinationState, *, now: datetime, actor: str) -> DestinationState:
    """A person disabled the destination: nothing is sent until it is resumed."""
    return replace(
        _closed(state),
        status=Status.DISABLED.value,
        opened_at=now,
        changed_by=f"disabled by {actor}",
    )
