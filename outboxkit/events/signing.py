"""Each delivery signed with its own subscription's secrets, at send time.

``SubscriptionSigningTransport`` sits under the URL guard in the deliveries
outbox's drainer (``KitEvents`` installs it): the guard checks and pins
the request, then this transport reads the subscription's id from the
placeholder ``build_delivery`` wrote (``outboxkit.events.deliveries``), signs
the request as Standard Webhooks defines it (``webhook-id`` = the delivery's
idempotency key, ``webhook-timestamp``, ``webhook-signature`` with each of
the subscription's secrets) and sends it.

The secrets are read from ``outboxkit_subscriptions`` and kept for
``refresh_seconds`` (5 s by default), so a rotation reaches every process
within that.  A subscription that is gone or disabled is a ``refused``
attempt: the row ends ``stuck`` with the reason, nothing is sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine, select

from outboxkit.events.deliveries import SIGNATURE_PLACEHOLDER
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.storage.tables import subscriptions
from outboxkit.transports.base import Delivery, Transport
from outboxkit.transports.signing import SIGNATURE_HEADER, WebhookSecrets

__all__ = ["SubscriptionSecrets", "SubscriptionSigningTransport"]


class SubscriptionSecrets:
    """The signing secrets of each subscription, read from the database and kept ``refresh_seconds``."""

    def __init__(self, engine: Engine, *, refresh_seconds: float = 5.0, monotonic: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.refresh_seconds = refresh_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._known: dict[int, tuple[float, WebhookSecrets | None, str | None]] = {}

    def lookup(self, subscription_id: int) -> tuple[WebhookSecrets | None, str | None]:
        """The subscription's secrets, or None and why it may not be sent to."""
        now = self._monotonic()
        with self._lock:
            known = self._known.get(subscription_id)
        if known is not None and now - known[0] < self.refresh_seconds:
            return known[1], known[2]
        statement = select(subscriptions.c.secrets, subscriptions.c.enabled, subscriptions.c.disabled_reason).where(
            subscriptions.c.id == subscription_id
        )
        with self.engine.connect() as connection:
            row = connection.execute(statement).first()
        secrets: WebhookSecrets | None = None
        if row is None:
            refusal: str | None = f"subscription {subscription_id} was deleted"
        elif not row.enabled:
            refusal = f"subscription {subscription_id} is disabled ({row.disabled_reason})"
        else:
            refusal = None
            try:
                secrets = WebhookSecrets(row.secrets)
            except (TypeError, ValueError) as exc:  # a row edited by hand; the message names a position only
                refusal = f"subscription {subscription_id}: {exc}"
        with self._lock:
            self._known[subscription_id] = (now, secrets, refusal)
            if len(self._known) > 100_000:
                self._known.clear()
        return secrets, refusal


class SubscriptionSigningTransport:
    """Signs each delivery with its subscription's secrets, then sends it through ``transport``.

    ``close()`` leaves ``transport`` open: it is the kit's, shared by its outboxes.
    """

    def __init__(self, transport: Transport, secrets: SubscriptionSecrets, *, now: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.secrets = secrets
        self._now = now

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        placeholder = next((value for name, value in delivery.headers.items() if name.lower() == SIGNATURE_HEADER), "")
        try:
            subscription_id = int(placeholder.removeprefix(SIGNATURE_PLACEHOLDER))
        except ValueError:  # not built by EventDelivery: there is no subscription to sign for
            return AttemptResult(
                failure=FailureKind.REFUSED, error="refused before sending: not a delivery of a subscription (EventDelivery)"
            )
        secrets, refusal = self.secrets.lookup(subscription_id)
        if secrets is None:
            return AttemptResult(failure=FailureKind.REFUSED, error=f"refused before sending: {refusal}")
        signed = delivery.with_headers(secrets.headers(idempotency_key, int(self._now()), delivery.body() or b""))
        return self.transport.send(signed, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        return None
