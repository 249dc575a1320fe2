"""Publishing an event, in the caller's transaction.

``publish(session, "invoice.paid", {...}, key=..., tenant=...)`` runs on the
caller's session (``publish_with(connection, ...)`` on a Core connection),
so the event and its deliveries commit or roll back with the business
change.  Before anything is written it checks, raising
``InvalidEventError`` with the field named:

* the event type's name (``invoice.paid``), the key and the tenant;
* the payload: JSON the kit can encode (``outboxkit.transports.base``
  rules), at most ``max_payload_bytes`` once encoded (256 KiB by default:
  each subscription's delivery row holds a copy);
* the event type in the catalog (``outboxkit_event_types``): with
  ``strict=True`` a type the catalog does not list is refused; a type with
  a JSON Schema has its payload checked (``outboxkit.events.schema_check``).

Then **one statement** writes everything: it selects the enabled
subscriptions whose filters match (one overlap of the type and its
prefixes with the GIN-indexed ``event_types``; a subscription with a
tenant matches only that tenant's events, one without a tenant only events
without one), inserts the event row, and inserts one delivery row per
match with ``INSERT ... SELECT``.  It holds a share lock on the matched
subscriptions until the caller's transaction ends: a change to one of them
(``SubscriptionStore``) waits for the publish to commit and then applies to
its deliveries too, and a publish that meets a change in progress waits for
it and reads the subscription as changed (under REPEATABLE READ or
SERIALIZABLE, PostgreSQL reports that meeting as a serialization failure
instead, which the caller retries).  An event nobody subscribed to is
recorded with no delivery.  A subscription created after the statement's
snapshot does not receive it.  More matches than ``max_deliveries``
(10,000 by default) and the statement writes nothing and the call raises:
a fan-out that large belongs in batches of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from sqlalchemy import Connection, Row, text
from sqlalchemy.orm import Session

from outboxkit.errors import InvalidDeliveryError, InvalidEventError
from outboxkit.events.definitions import EVENT_TYPE, MAX_NAME, filter_candidates
from outboxkit.events.schema_check import check_payload
from outboxkit.transports.base import encode_json

__all__ = [
    "CATALOG", "DEFAULT_MAX_DELIVERIES", "DEFAULT_MAX_PAYLOAD_BYTES", "PUBLISH", "PublishCall", "PublishOptions",
    "Published", "publish", "publish_with",
]

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
DEFAULT_MAX_DELIVERIES = 10_000

CATALOG = text("SELECT schema FROM outboxkit_event_types WHERE name = :event_type")
# One statement: the matches (at most :over of them), the event and its deliveries, written only when the
# matches are fewer than :over.  The envelope is built once, in the event's RETURNING.
PUBLISH = text(
    """
WITH matched AS MATERIALIZED (
    SELECT s.id, s.url, s.destination, s.headers FROM outboxkit_subscriptions AS s
    WHERE s.enabled AND s.event_types && CAST(:candidates AS varchar[])
      AND s.tenant IS NOT DISTINCT FROM CAST(:tenant AS varchar)
    LIMIT :over
    FOR SHARE OF s
), found AS (
    SELECT count(*) AS n FROM matched
), event AS (
    INSERT INTO outboxkit_events (event_type, tenant, key, payload)
    SELECT :event_type, :tenant, :key, CAST(:payload AS jsonb) FROM found WHERE found.n < :over
    RETURNING id, jsonb_build_object(
        'type', event_type,
        'timestamp', to_char(published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', payload
    ) AS body
), delivered AS (
    INSERT INTO outboxkit_event_deliveries
        (event_id, subscription_id, event_type, tenant, ordering_key, url, destination, headers, body)
    SELECT event.id, matched.id, :event_type, :tenant,
           CASE WHEN CAST(:key AS varchar) IS NULL THEN NULL ELSE matched.id || ':' || CAST(:key AS varchar) END,
           matched.url, matched.destination, matched.headers, event.body
    FROM matched CROSS JOIN event
    RETURNING 1
)
SELECT (SELECT id FROM event) AS event_id, (SELECT n FROM found) AS matched, (SELECT count(*) FROM delivered) AS deliveries
"""
)


@dataclass(frozen=True)
class Published:
    """What ``publish`` wrote: the event's id and how many deliveries (0: nobody subscribed)."""

    event_id: int
    deliveries: int


class PublishOptions(TypedDict, total=False):
    """The keyword arguments of ``publish``, ``publish_with`` and their async forms."""

    key: str | None
    tenant: str | None
    strict: bool
    max_payload_bytes: int
    max_deliveries: int


def publish(session: Session, event_type: str, payload: Any, **options: Unpack[PublishOptions]) -> Published:
    """Publish one event in ``session``'s transaction; see the module docstring.  Commit it with your change.

    ``key`` orders each subscription's deliveries of one key; ``tenant`` picks the subscriptions of that tenant;
    ``strict`` refuses a type the catalog does not list; ``max_payload_bytes`` and ``max_deliveries`` bound the
    payload and the fan-out.
    """
    return publish_with(session.connection(), event_type, payload, **options)


def publish_with(connection: Connection, event_type: str, payload: Any, **options: Unpack[PublishOptions]) -> Published:
    """``publish`` on a Core ``Connection``, in the transaction it is in."""
    call = PublishCall.of(event_type, payload, options)
    call.check_catalog(connection.execute(CATALOG, {"event_type": event_type}).first())
    return call.published(connection.execute(PUBLISH, call.parameters).one())


@dataclass(frozen=True)
class PublishCall:
    """One publish checked before the database is touched: its ``PUBLISH`` parameters and what judges the answers.

    ``publish_with`` and ``outboxkit.events.publish_async`` run the same two statements with it, sync or awaited.
    """

    event_type: str
    encoded: bytes
    parameters: dict[str, Any]
    strict: bool
    max_deliveries: int

    @classmethod
    def of(cls, event_type: str, payload: Any, options: PublishOptions) -> PublishCall:
        key, tenant = options.get("key"), options.get("tenant")
        max_deliveries = options.get("max_deliveries", DEFAULT_MAX_DELIVERIES)
        _check_names(event_type, key, tenant)
        encoded = _encoded(payload, options.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES))
        parameters = {
            "candidates": filter_candidates(event_type), "tenant": tenant, "key": key, "event_type": event_type,
            "payload": encoded.decode(), "over": max_deliveries + 1,
        }
        return cls(event_type, encoded, parameters, options.get("strict", False), max_deliveries)

    def check_catalog(self, found: Row[Any] | None) -> None:
        """Refuse, by the type's catalog row (``CATALOG``), an unknown type when strict, a payload its schema refuses."""
        if found is None and self.strict:
            raise InvalidEventError(
                "event_type",
                f"{self.event_type!r} is not in the catalog of event types; define it (EventTypeCatalog.define) first",
            )
        if found is not None and found[0] is not None:
            check_payload(self.event_type, found[0], json.loads(self.encoded))

    def published(self, row: Row[Any]) -> Published:
        """``PUBLISH``'s answer; a fan-out over ``max_deliveries`` (nothing written) raises."""
        if row.event_id is None:
            raise InvalidEventError(
                "event_type",
                f"{self.event_type!r} matches more than {self.max_deliveries} enabled subscriptions; nothing was "
                "written. Raise max_deliveries, or split the audience (by tenant, or by a narrower event type)",
            )
        return Published(event_id=row.event_id, deliveries=row.deliveries)


def _check_names(event_type: object, key: object, tenant: object) -> None:
    if not isinstance(event_type, str) or len(event_type) > MAX_NAME or not EVENT_TYPE.fullmatch(event_type):
        raise InvalidEventError(
            "event_type", f"{str(event_type)[:80]!r} is not an event type name (dot-separated words, e.g. invoice.paid)"
        )
    for name, value in (("key", key), ("tenant", tenant)):
        if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME):
            raise InvalidEventError(name, f"a {name} is None or a string of 1 to {MAX_NAME} characters")


def _encoded(payload: Any, limit: int) -> bytes:
    try:
        encoded = encode_json(payload)
    except InvalidDeliveryError as exc:
        raise InvalidEventError("payload", str(exc).replace("Delivery.json", "payload")) from None
    if len(encoded) > limit:
        raise InvalidEventError(
            "payload", f"{len(encoded)} bytes once encoded, over the bound of {limit} (max_payload_bytes); each "
            "subscription's delivery holds a copy: send a reference (an id, a URL) rather than the document"
        )
    return encoded
