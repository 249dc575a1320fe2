"""A subscription as data, checked before anything is written.

``SubscriptionDefinition`` is what a person or a program asks for: the
endpoint, the event types it wants, its tenant, its signing secrets and its
custom headers.  Building one checks everything that needs no lookup:

* ``event_types``: one to 100 filters, each an event type's exact name
  (``invoice.paid``) or a prefix ending in ``.*`` (``invoice.*`` matches
  ``invoice.paid`` and ``invoice.line.added``).  An empty list would match
  nothing and ``*`` everything: both are refused;
* ``secrets``: one or more Standard Webhooks secrets (``whsec_<base64>`` of
  at least 16 bytes, ``outboxkit.transports.signing``); the first signs, the
  others sign too while a rotation is under way.  A malformed one is named
  by its position, never by its value;
* ``headers``: valid names and values; headers that frame or route the
  request (``Host``, ``Content-Length``...) and the signature's own
  (``webhook-*``) are refused; so is a literal credential
  (``Authorization: Bearer ...``), which must be a reference to a setting
  (``secret:NAME``, ``outboxkit.target_secrets``), checked by the store;
* ``tenant``: None or 1 to 200 characters;
* ``rate_limit`` (requests per second, more than 0) and ``max_in_flight``
  (sends in flight at once, 1 or more): the subscription's own limits,
  held to the rules of an operator's limits of a destination
  (``outboxkit.destinations.limits.check_limits``, the same messages); None
  is the deliveries outbox's own.  ``SubscriptionStore`` writes them as its
  destination's limits, which every claim reads.

The URL's scheme and credentials are checked here; whether its host may be
sent to is the URL guard's answer at save (``SubscriptionStore``) and again
at every send.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from outboxkit.destinations.limits import check_limits
from outboxkit.errors import InvalidSubscriptionError, InvalidValueError
from outboxkit.transports.base import Delivery
from outboxkit.transports.signing import WebhookSecrets

__all__ = ["EVENT_TYPE", "MAX_FILTERS", "SubscriptionDefinition", "filter_candidates"]

# An event type's name: dot-separated words of letters, digits, '_' and '-' ("invoice.paid", "user-seat.added").
EVENT_TYPE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.\*")
MAX_FILTERS = 100
MAX_NAME = 200
_SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def filter_candidates(event_type: str) -> list[str]:
    """The filters that match ``event_type``: its name and each prefix of it (``a.b.c`` -> ``a.b.c, a.*, a.b.*``)."""
    parts = event_type.split(".")
    return [event_type, *(".".join(parts[:end]) + ".*" for end in range(1, len(parts)))]


@dataclass(frozen=True, kw_only=True)
class SubscriptionDefinition:
    """What a subscription asks for; see the module docstring for the rules each field is held to."""

    url: str
    event_types: Sequence[str]
    secrets: Sequence[str] = field(repr=False)
    tenant: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    rate_limit: float | None = None
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_types", _filters(self.event_types))
        object.__setattr__(self, "secrets", _secrets(self.secrets))
        object.__setattr__(self, "headers", _headers(self.headers, self.url))
        if self.tenant is not None and (not isinstance(self.tenant, str) or not 1 <= len(self.tenant) <= MAX_NAME):
            raise InvalidSubscriptionError("tenant", f"a tenant is None or a string of 1 to {MAX_NAME} characters")
        if not isinstance(self.description, str) or len(self.description) > 2000:
            raise InvalidSubscriptionError("description", "a description is a string of at most 2000 characters")
        object.__setattr__(self, "rate_limit", _limit("rate_limit", self.rate_limit, None)[0])
        object.__setattr__(self, "max_in_flight", _limit("max_in_flight", None, self.max_in_flight)[1])


def _limit(field_name: str, per_second: object, cap: object) -> tuple[float | None, int | None]:
    """One limit checked by the destination limits' rule, its message under the subscription's field name."""
    try:
        return check_limits(per_second, cap)
    except InvalidValueError as exc:
        raise InvalidSubscriptionError(field_name, str(exc)) from None


def _filters(filters: object) -> tuple[str, ...]:
    if isinstance(filters, str) or not isinstance(filters, Sequence):
        raise InvalidSubscriptionError("event_types", "a list of event types, e.g. ['invoice.paid', 'customer.*']")
    if not filters:
        raise InvalidSubscriptionError("event_types", "an empty list matches no event; name at least one event type")
    if len(filters) > MAX_FILTERS:
        raise InvalidSubscriptionError(
            "event_types", f"at most {MAX_FILTERS} filters, got {len(filters)}; use a prefix (invoice.*)"
        )
    found: list[str] = []
    for position, entry in enumerate(filters, start=1):
        if entry in ("*", ".*", "**"):
            raise InvalidSubscriptionError(
                "event_types", f"filter #{position} {entry!r} would match every event; name the types or their prefixes"
            )
        if not isinstance(entry, str) or len(entry) > MAX_NAME or not (EVENT_TYPE.fullmatch(entry) or _PREFIX.fullmatch(entry)):
            raise InvalidSubscriptionError(
                "event_types",
                f"filter #{position} {str(entry)[:80]!r} is neither an event type (invoice.paid) nor a prefix (invoice.*)",
            )
        if entry not in found:
            found.append(entry)
    return tuple(found)


def _secrets(secrets: object) -> tuple[str, ...]:
    if isinstance(secrets, str) or not isinstance(secrets, Sequence):
        raise InvalidSubscriptionError("secrets", "a list of 'whsec_...' secrets (several while rotating)")
    try:
        WebhookSecrets(secrets)  # the message names a bad secret by position, never its value
    except (TypeError, ValueError) as exc:
        raise InvalidSubscriptionError("secrets", str(exc)) from None
    return tuple(str(secret).strip() for secret in secrets)


def _headers(headers: object, url: object) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        raise InvalidSubscriptionError("headers", "headers are a mapping of names to values")
    for name in headers:
        if str(name).lower() in _SIGNATURE_HEADERS:
            raise InvalidSubscriptionError("headers", f"{name!r} is set by the signature; it may not be a custom header")
    try:  # names, values and the framing headers, by the rules every delivery follows
        Delivery(url=url if isinstance(url, str) else "http://invalid", headers=dict(headers))
    except InvalidValueError as exc:
        field_name = "url" if "URL" in str(exc) or "url" in str(exc) else "headers"
        raise InvalidSubscriptionError(field_name, str(exc)) from None
    return {str(name): str(value) for name, value in headers.items()}
