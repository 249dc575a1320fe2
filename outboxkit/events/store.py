"""The subscription rows: create, edit, enable, disable, delete, each audited.

Each change is one short transaction: it locks the row (``FOR UPDATE``),
writes it, records who did what with the row before and after in
``outboxkit_subscription_audit`` (the secrets counted, never copied) and
applies the change to the subscription's deliveries not yet sent, in the
same transaction:

* **edit**: pending deliveries take the new URL and headers (an event
  already published goes where the subscription points now);
* **disable** (with a reason): pending deliveries are set ``stuck`` with
  ``held: subscription <id> disabled (<reason>)`` in ``last_error``; they
  keep their attempts and are not sent.  **enable** puts exactly those back
  to ``pending``, due now;
* **rotate**: a new signing secret signs first; the previous first one
  keeps signing beside it (``keep_previous``) until the receiver has
  switched, older ones go; the deliveries not yet sent are signed with the
  new set at their send;
* **delete**: pending deliveries are set ``stuck`` with ``subscription
  <id> was deleted`` in ``last_error``; nothing undelivered is deleted, and
  their events stay.  Its limits row goes (no delivery of it is sent again).

A subscription's own limits (``rate_limit``, ``max_in_flight``) are its
destination's limits on the deliveries outbox: the row of
``outboxkit_destination_limits`` that an operator's limits of a destination
also live in (``outboxkit.destinations.limits``), read by every claim and
woken on commit.  There is no other copy: **create** and **edit** write that
row in the subscription's transaction (or delete it when both are None: the
deliveries outbox's own), an edit that moves the URL moves the row to the new
destination and deletes the old one, **disable** and **enable** leave it as it
is, and a read shows what the row holds now (an operator's change of that
destination included).  Each audit entry records them (``rate_limit``,
``max_in_flight``) before and after.

A publish holds a share lock on the subscriptions it matched until its
transaction ends (``outboxkit.events.publish``), so a change waits for the
publishes in progress and then sees their deliveries: none escapes it.  As a
last guard (a row changed by hand in SQL), the signer refuses, at the send,
a delivery whose subscription is deleted or disabled: the row ends ``stuck``
with the reason and nothing is sent.

The endpoint URL passes the kit's URL guard (``outboxkit.url_guard``) at
save: a URL it refuses is an ``InvalidSubscriptionError`` on ``url`` and
nothing is written.  It passes again at every send.
"""

from __future__ import annotations

import base64
import secrets as random_secrets
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, RowMapping, delete, insert, select, text, update

from outboxkit.breaker import destination_of
from outboxkit.clock import Clock, SystemClock
from outboxkit.destinations.limits import DestinationLimits, write_limits
from outboxkit.errors import InvalidSubscriptionError, UnknownSubscriptionError, UnsafeUrlError
from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.deliveries import EventDelivery, deliveries_table
from outboxkit.events.subscription_limits import limits_asked, limits_in_row, locked_limits, move_limits, with_limits
from outboxkit.storage.tables import subscription_audit, subscriptions
from outboxkit.target_secrets import credential_problem, redact_headers, redact_url
from outboxkit.transports.signing import WebhookSecrets
from outboxkit.url_guard import UrlGuard

__all__ = ["DISABLED_MARK", "Subscription", "SubscriptionStore", "generated_secret", "subscription_destination"]

DISABLED_MARK = "held: subscription {id} disabled"
DELETED_MARK = "subscription {id} was deleted"
_deliveries = deliveries_table()


class Transactions(Protocol):
    """Where the store reads and writes: an ``Engine``, or the operator's ``OperatorDatabase`` (its time budget)."""

    def connect(self) -> AbstractContextManager[Connection]: ...

    def begin(self) -> AbstractContextManager[Connection]: ...


@dataclass(frozen=True, kw_only=True)
class Subscription:
    """A subscription row as read; its secrets are counted, not shown."""

    id: int
    url: str
    event_types: tuple[str, ...]
    tenant: str | None
    headers: dict[str, str]
    description: str
    secret_count: int
    enabled: bool
    disabled_reason: str | None
    created_at: datetime
    created_by: str
    changed_at: datetime
    changed_by: str
    rate_limit: float | None = None
    max_in_flight: int | None = None


def _subscription(row: RowMapping, limits: DestinationLimits) -> Subscription:
    return Subscription(
        id=row["id"], url=redact_url(row["url"]), event_types=tuple(row["event_types"]), tenant=row["tenant"],
        headers=redact_headers(row["headers"]), description=row["description"], secret_count=len(row["secrets"]),
        enabled=row["enabled"], disabled_reason=row["disabled_reason"], created_at=row["created_at"],
        created_by=row["created_by"], changed_at=row["changed_at"], changed_by=row["changed_by"],
        rate_limit=limits.per_second, max_in_flight=limits.cap,
    )


def subscription_destination(subscription_id: int, url: str) -> str:
    """The destination of a subscription's deliveries: its own (``subscription 12: https://host:443``).

    Per subscription, not per host: the breaker, the cap on sends in flight and the claim's turns
    (``outboxkit.storage.destination_claim``) then treat each customer's endpoint apart, so one customer's
    failing, slow or backlogged endpoint does not hold back another's on the same platform.
    """
    return f"subscription {subscription_id}: {destination_of(url)}"[:300]


def generated_secret() -> str:
    """A new Standard Webhooks secret: ``whsec_`` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(random_secrets.token_bytes(24)).decode()


def _snapshot(row: RowMapping | None, limits: DestinationLimits) -> dict[str, Any] | None:
    """A row and its limits as JSON for the audit: times as ISO 8601, URL and headers redacted, the secrets counted."""
    if row is None:
        return None
    shown = {key: value.isoformat() if isinstance(value, datetime) else value for key, value in row.items()}
    shown["url"] = redact_url(shown["url"])
    shown["headers"] = redact_headers(row["headers"])
    shown["secrets"] = len(shown["secrets"])
    shown["event_types"] = list(shown["event_types"])
    shown["rate_limit"] = limits.per_second
    shown["max_in_flight"] = limits.cap
    return shown


class SubscriptionStore:
    """Reads and changes subscription rows.

    ``engine``: an ``Engine`` or the operator's ``OperatorDatabase``.
    ``url_guard`` checks each endpoint at save (the kit's, with the
    settings' allow-list, through ``KitEvents``; by default no non-public
    address is let through).  ``secret_names``: the settings' secrets, which
    a custom header may reference as ``secret:NAME``.
    """

    def __init__(
        self,
        engine: Transactions,
        *,
        url_guard: UrlGuard | None = None,
        secret_names: Collection[str] = (),
        clock: Clock | None = None,
    ) -> None:
        self.engine = engine
        self.url_guard = url_guard if url_guard is not None else UrlGuard()
        self.secret_names = frozenset(secret_names)
        self.clock = clock or SystemClock()

    # -- reading ---------------------------------------------------------------

    def get(self, subscription_id: int) -> Subscription:
        statement = with_limits().where(subscriptions.c.id == subscription_id)
        with self.engine.connect() as connection:
            row = connection.execute(statement).mappings().first()
        if row is None:
            raise UnknownSubscriptionError(f"no subscription with id {subscription_id!r}")
        return _subscription(row, limits_in_row(row))

    def list(self, *, tenant: str | None = None) -> Sequence[Subscription]:
        """Every subscription (of ``tenant``, when given), by id, with its limits."""
        statement = with_limits().order_by(subscriptions.c.id)
        if tenant is not None:
            statement = statement.where(subscriptions.c.tenant == tenant)
        with self.engine.connect() as connection:
            return [_subscription(row, limits_in_row(row)) for row in connection.execute(statement).mappings()]

    # -- changing --------------------------------------------------------------

    def create(self, definition: SubscriptionDefinition, *, actor: str) -> Subscription:
        """Insert a subscription, and its limits as its destination's; it receives the events published after it
        commits."""
        self._check(definition)
        now = self.clock.now()
        values = {**self._values(definition), "created_at": now, "created_by": actor, "changed_at": now, "changed_by": actor}
        limits = limits_asked(definition)
        with self.engine.begin() as connection:
            created = connection.execute(insert(subscriptions).values(values).returning(subscriptions.c.id)).scalar_one()
            row = connection.execute(
                update(subscriptions).where(subscriptions.c.id == created)
                .values(destination=subscription_destination(created, definition.url)).returning(*subscriptions.c)
            ).mappings().one()
            if not limits.empty:
                write_limits(connection, EventDelivery, row["destination"], limits, now=now, actor=actor)
            self._audit(connection, "create", actor=actor, before=None, after=row, limits=(DestinationLimits(), limits))
        return _subscription(row, limits)

    def edit(
        self, subscription_id: int, definition: SubscriptionDefinition, *, actor: str, keep_secrets: bool = False
    ) -> Subscription:
        """Replace a subscription's definition; its pending deliveries take the new URL and headers, and its limits
        are the definition's (None: the deliveries outbox's own), on its destination as the URL makes it.

        ``keep_secrets=True`` leaves the stored secrets as they are (the definition's are not written): an
        operator edits the rest without ever seeing them; ``rotate_secret`` changes them.
        """
        self._check(definition)
        values = {**self._values(definition), "destination": subscription_destination(subscription_id, definition.url)}
        if keep_secrets:
            del values["secrets"]
        limits = limits_asked(definition)
        with self.engine.begin() as connection:
            current = self._row(connection, subscription_id, lock=True)
            before = locked_limits(connection, current)
            row = self._write(connection, current, values, actor=actor, action="edit", limits=(before, limits))
            move_limits(connection, current["destination"], before, row["destination"], limits, now=self.clock.now(), actor=actor)
            connection.execute(
                update(_deliveries)
                .where(_deliveries.c.subscription_id == subscription_id, _deliveries.c.status == "pending")
                .values(url=definition.url, destination=values["destination"], headers=dict(definition.headers))
            )
        return _subscription(row, limits)

    def disable(self, subscription_id: int, *, reason: str, actor: str) -> Subscription:
        """Disable a subscription: no new deliveries, and its pending ones held (``stuck``) until it is enabled."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidSubscriptionError("reason", "say why the subscription is disabled (shown to operators)")
        mark = f"{DISABLED_MARK.format(id=subscription_id)} ({reason.strip()[:500]})"
        with self.engine.begin() as connection:
            current = self._row(connection, subscription_id, lock=True)
            values = {"enabled": False, "disabled_reason": reason.strip()[:500]}
            limits = locked_limits(connection, current)
            row = self._write(connection, current, values, actor=actor, action="disable", limits=(limits, limits))
            self._park(connection, subscription_id, mark)
        return _subscription(row, limits)

    def enable(self, subscription_id: int, *, actor: str) -> Subscription:
        """Enable a subscription again; the deliveries its disable held are pending again, due now."""
        held = DISABLED_MARK.format(id=subscription_id)
        with self.engine.begin() as connection:
            current = self._row(connection, subscription_id, lock=True)
            limits = locked_limits(connection, current)
            values = {"enabled": True, "disabled_reason": None}
            row = self._write(connection, current, values, actor=actor, action="enable", limits=(limits, limits))
            connection.execute(
                update(_deliveries)
                .where(
                    _deliveries.c.subscription_id == subscription_id,
                    _deliveries.c.status == "stuck",
                    _deliveries.c.last_error.startswith(held, autoescape=True),
                )
                .values(status="pending", next_attempt_at=text("now()"), last_error=None, updated_at=text("now()"))
            )
        return _subscription(row, limits)

    def rotate_secret(
        self, subscription_id: int, *, actor: str, secret: str | None = None, keep_previous: bool = True
    ) -> tuple[Subscription, str]:
        """Give the subscription a new first secret (``secret``, or one generated); the row and the new secret.

        With ``keep_previous`` the secret that signed until now signs too, so the receiver can switch; older ones
        are dropped.  The new secret is returned once, to hand to the receiver; reads never show it.
        """
        new = secret.strip() if isinstance(secret, str) else generated_secret()
        try:
            WebhookSecrets([new])  # the message names the position, never the value
        except (TypeError, ValueError) as exc:
            raise InvalidSubscriptionError("secret", str(exc)) from None
        with self.engine.begin() as connection:
            current = self._row(connection, subscription_id, lock=True)
            kept = [current["secrets"][0]] if keep_previous and current["secrets"][0] != new else []
            limits = locked_limits(connection, current)
            values = {"secrets": [new, *kept]}
            row = self._write(connection, current, values, actor=actor, action="rotate", limits=(limits, limits))
        return _subscription(row, limits), new

    def delete(self, subscription_id: int, *, actor: str) -> None:
        """Delete a subscription and its limits; its pending deliveries end ``stuck`` (kept, never sent), its events
        stay."""
        with self.engine.begin() as connection:
            current = self._row(connection, subscription_id, lock=True)
            limits = locked_limits(connection, current)
            connection.execute(delete(subscriptions).where(subscriptions.c.id == subscription_id))
            move_limits(connection, current["destination"], limits, None, DestinationLimits(), now=self.clock.now(), actor=actor)
            self._audit(connection, "delete", actor=actor, before=current, after=None, limits=(limits, DestinationLimits()))
            self._park(connection, subscription_id, DELETED_MARK.format(id=subscription_id))

    # -- internals -------------------------------------------------------------

    def _check(self, definition: SubscriptionDefinition) -> None:
        if not isinstance(definition, SubscriptionDefinition):
            raise InvalidSubscriptionError("definition", f"a SubscriptionDefinition, got {type(definition).__name__}")
        problem = credential_problem(definition.headers, self.secret_names)
        if problem is not None:
            raise InvalidSubscriptionError("headers", problem)
        try:
            self.url_guard.check(definition.url)
        except UnsafeUrlError as exc:
            raise InvalidSubscriptionError("url", str(exc)) from None

    @staticmethod
    def _values(definition: SubscriptionDefinition) -> dict[str, Any]:
        return {
            "url": definition.url,
            "event_types": list(definition.event_types),
            "tenant": definition.tenant,
            "secrets": list(definition.secrets),
            "headers": dict(definition.headers),
            "description": definition.description,
        }

    @staticmethod
    def _row(connection: Connection, subscription_id: int, *, lock: bool) -> RowMapping:
        statement = select(subscriptions).where(subscriptions.c.id == subscription_id)
        row = connection.execute(statement.with_for_update() if lock else statement).mappings().first()
        if row is None:
            raise UnknownSubscriptionError(f"no subscription with id {subscription_id!r}")
        return row

    def _write(
        self,
        connection: Connection,
        current: RowMapping,
        values: dict[str, Any],
        *,
        actor: str,
        action: str,
        limits: tuple[DestinationLimits, DestinationLimits],
    ) -> RowMapping:
        values = {**values, "changed_at": self.clock.now(), "changed_by": actor}
        statement = update(subscriptions).where(subscriptions.c.id == current["id"]).values(values).returning(*subscriptions.c)
        row = connection.execute(statement).mappings().one()
        self._audit(connection, action, actor=actor, before=current, after=row, limits=limits)
        return row

    @staticmethod
    def _park(connection: Connection, subscription_id: int, reason: str) -> None:
        connection.execute(
            update(_deliveries)
            .where(_deliveries.c.subscription_id == subscription_id, _deliveries.c.status == "pending")
            .values(status="stuck", last_error=reason, updated_at=text("now()"))
        )

    def _audit(
        self,
        connection: Connection,
        action: str,
        *,
        actor: str,
        before: RowMapping | None,
        after: RowMapping | None,
        limits: tuple[DestinationLimits, DestinationLimits],
    ) -> None:
        subscription_id = (after or before)["id"]  # type: ignore[index]
        connection.execute(
            insert(subscription_audit).values(
                at=self.clock.now(), actor=actor, subscription_id=subscription_id, action=action,
                before=_snapshot(before, limits[0]), after=_snapshot(after, limits[1]),
            )
        )

