"""Past events sent again to one subscription on purpose, and a test event sent to one.

A subscription receives only the events published after it committed
(``outboxkit.events.publish``).  ``EventReplay.replay`` sends older ones on
purpose: the events still stored in ``outboxkit_events`` that

* the subscription's own filters match (an exact name, or a ``prefix.*``),
  and its tenant (a subscription with a tenant only that tenant's events, one
  without only events published without one: a replay never crosses tenants);
* fall in ``[since, until)`` by ``published_at``, and, when ``event_types`` is
  given, match one of those filters too (a narrower choice, never a wider one).

With ``dry_run=True`` it counts them and writes nothing.  Otherwise one
``INSERT ... SELECT`` enqueues one new delivery per event (a new idempotency
key: a replay is a new delivery, the receiver sees it as such), in
publication order, with the subscription's URL, headers and destination now,
and the audit records who replayed what and how many, in the same
transaction.  More than ``max_events`` matches and nothing is written: narrow
the range.  A disabled subscription is refused (enable it first).

``send_test`` records an event of type ``outboxkit.test`` (the tenant is the
subscription's) and enqueues its one delivery, to that subscription only,
audited as ``test``: what an operator does to check an endpoint and its
signature.

Events are kept: the kit never deletes a row of ``outboxkit_events``, so a
replay reaches back as far as the table does (docs/events.md says how to
bound it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, TextClause, insert, text

from outboxkit.clock import Clock, SystemClock
from outboxkit.errors import InvalidSubscriptionError, UnknownSubscriptionError
from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.store import Transactions, generated_secret
from outboxkit.storage.tables import subscription_audit

__all__ = ["DEFAULT_MAX_REPLAY_EVENTS", "TEST_EVENT_TYPE", "EventReplay", "ReplayResult"]

DEFAULT_MAX_REPLAY_EVENTS = 10_000
TEST_EVENT_TYPE = "outboxkit.test"

# The events a subscription's filters and tenant match, in [since, until), narrowed by :narrow when given.
_MATCHING = """
FROM outboxkit_events AS e, sub
WHERE e.published_at >= :since AND e.published_at < :until
  AND e.tenant IS NOT DISTINCT FROM sub.tenant
  AND EXISTS (SELECT 1 FROM unnest(sub.event_types) AS f(filter)
              WHERE e.event_type = f.filter OR (f.filter LIKE '%.*' AND starts_with(e.event_type, left(f.filter, -1))))
  AND (CAST(:narrow AS varchar[]) IS NULL OR EXISTS (
       SELECT 1 FROM unnest(CAST(:narrow AS varchar[])) AS n(filter)
       WHERE e.event_type = n.filter OR (n.filter LIKE '%.*' AND starts_with(e.event_type, left(n.filter, -1)))))
"""
_SUBSCRIPTION = "WITH sub AS (SELECT * FROM outboxkit_subscriptions WHERE id = :subscription)\n"
_COUNT = text(_SUBSCRIPTION + "SELECT count(*) FROM (SELECT 1 " + _MATCHING + " LIMIT :over) AS found")


def _enqueue(selection: str) -> TextClause:
    """One delivery to the subscription per event of ``selection`` (a FROM ... WHERE over ``e`` and ``sub``), in order."""
    return text(
        _SUBSCRIPTION
        + """
, delivered AS (
    INSERT INTO outboxkit_event_deliveries
        (event_id, subscription_id, event_type, tenant, ordering_key, url, destination, headers, body)
    SELECT e.id, sub.id, e.event_type, e.tenant,
           CASE WHEN e.key IS NULL THEN NULL ELSE sub.id || ':' || e.key END,
           sub.url, sub.destination, sub.headers,
           jsonb_build_object(
               'type', e.event_type,
               'timestamp', to_char(e.published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'data', e.payload)
    """
        + selection
        + """
    ORDER BY e.id
    RETURNING 1
)
SELECT count(*) FROM delivered
"""
    )


_ENQUEUE_MATCHING = _enqueue(_MATCHING)
_ENQUEUE_ONE = _enqueue("FROM outboxkit_events AS e, sub WHERE e.id = :event")
_TEST_EVENT = text(
    "INSERT INTO outboxkit_events (event_type, tenant, payload) "
    "SELECT :event_type, tenant, jsonb_build_object('subscription', id, 'message', CAST(:message AS text)) "
    "FROM outboxkit_subscriptions WHERE id = :subscription RETURNING id"
)


@dataclass(frozen=True)
class ReplayResult:
    """What a replay found (``events``) and, unless it was a dry run, enqueued (``enqueued``)."""

    subscription_id: int
    events: int
    enqueued: int
    dry_run: bool


class EventReplay:
    """Replays stored events to one subscription, and sends it test events; each audited."""

    def __init__(self, engine: Transactions, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock = clock or SystemClock()

    def replay(
        self,
        subscription_id: int,
        *,
        since: datetime,
        until: datetime | None = None,
        event_types: Sequence[str] | None = None,
        dry_run: bool = False,
        actor: str,
        max_events: int = DEFAULT_MAX_REPLAY_EVENTS,
    ) -> ReplayResult:
        """Enqueue the stored events ``subscription_id`` matches in ``[since, until)``; see the module docstring."""
        until = until if until is not None else self.clock.now()
        narrow = _narrowing(event_types)
        if since.tzinfo is None or until.tzinfo is None:
            raise InvalidSubscriptionError("since", "since and until need a timezone (e.g. 2026-12-01T00:00:00Z)")
        if since >= until:
            raise InvalidSubscriptionError("since", f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
        parameters = {"subscription": subscription_id, "since": since, "until": until, "narrow": narrow,
                      "over": max_events + 1}
        with self.engine.begin() as connection:
            current = _locked(connection, subscription_id)
            found = connection.execute(_COUNT, parameters).scalar_one()
            if found > max_events:
                raise InvalidSubscriptionError(
                    "since", f"more than {max_events:,} events match; nothing was enqueued. Narrow the time range or the types"
                )
            if dry_run:
                return ReplayResult(subscription_id=subscription_id, events=found, enqueued=0, dry_run=True)
            _refuse_disabled(current)
            enqueued = connection.execute(_ENQUEUE_MATCHING, parameters).scalar_one()
            details = {"since": since.isoformat(), "until": until.isoformat(), "event_types": narrow, "events": enqueued}
            self._audit(connection, subscription_id, "replay", actor=actor, details=details)
        return ReplayResult(subscription_id=subscription_id, events=found, enqueued=enqueued, dry_run=False)

    def send_test(self, subscription_id: int, *, actor: str) -> int:
        """Record an ``outboxkit.test`` event and enqueue its one delivery to ``subscription_id``; its event id."""
        with self.engine.begin() as connection:
            _enabled(connection, subscription_id)
            event = connection.execute(
                _TEST_EVENT,
                {"event_type": TEST_EVENT_TYPE, "subscription": subscription_id, "message": f"a test event sent by {actor}"},
            ).one()
            connection.execute(_ENQUEUE_ONE, {"subscription": subscription_id, "event": event.id})
            self._audit(connection, subscription_id, "test", actor=actor, details={"event": event.id})
        return int(event.id)

    def resend(self, subscription_id: int, event_id: int, *, actor: str) -> int:
        """Enqueue one new delivery of event ``event_id`` to ``subscription_id``, which must have received it.

        The event must be one the subscription was sent (a delivery of it to this subscription exists), so a
        resend never reaches an event of another tenant or type.  Audited as ``replay``; 1 when enqueued.
        """
        with self.engine.begin() as connection:
            _enabled(connection, subscription_id)
            sent = connection.execute(
                text("SELECT 1 FROM outboxkit_event_deliveries WHERE subscription_id = :subscription AND event_id = :event "
                     "LIMIT 1"), {"subscription": subscription_id, "event": event_id},
            ).first()
            if sent is None:
                raise UnknownSubscriptionError(f"subscription {subscription_id} was never sent event {event_id!r}")
            enqueued = connection.execute(_ENQUEUE_ONE, {"subscription": subscription_id, "event": event_id}).scalar_one()
            self._audit(connection, subscription_id, "replay", actor=actor, details={"event": event_id, "events": enqueued})
        return int(enqueued)

    def _audit(self, connection: Connection, subscription_id: int, action: str, *, actor: str, details: dict[str, Any]) -> None:
        connection.execute(
            insert(subscription_audit).values(
                at=self.clock.now(), actor=actor, subscription_id=subscription_id, action=action, before=None, after=details
            )
        )


def _locked(connection: Connection, subscription_id: int) -> RowMapping:
    row = connection.execute(
        text("SELECT * FROM outboxkit_subscriptions WHERE id = :id FOR UPDATE"), {"id": subscription_id}
    ).mappings().first()
    if row is None:
        raise UnknownSubscriptionError(f"no subscription with id {subscription_id!r}")
    return row


def _refuse_disabled(row: RowMapping) -> None:
    if not row["enabled"]:
        raise InvalidSubscriptionError(
            "subscription", f"subscription {row['id']} is disabled ({row['disabled_reason']}); enable it first"
        )


def _enabled(connection: Connection, subscription_id: int) -> RowMapping:
    """The subscription's row, locked; a disabled one is refused."""
    row = _locked(connection, subscription_id)
    _refuse_disabled(row)
    return row


def _narrowing(event_types: Sequence[str] | None) -> list[str] | None:
    if event_types is None or (not isinstance(event_types, str) and len(event_types) == 0):
        return None
    try:  # the same rules as a subscription's filters
        checked = SubscriptionDefinition(url="https://example.invalid/", event_types=event_types, secrets=[generated_secret()])
    except InvalidSubscriptionError as exc:
        raise InvalidSubscriptionError("event_types", str(exc).removeprefix("event_types: ")) from None
    return list(checked.event_types)

