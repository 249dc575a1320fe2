"""``KitEvents``: events and subscriptions wired to a kit.

::

    kit = OutboxKit(engine, outboxes=[Order, EventDelivery])
    events = KitEvents(kit)
    events.subscriptions.create(SubscriptionDefinition(...), actor="alice@example.com")

It installs the per-subscription signer under the URL guard of the
deliveries outbox's drainer (``outboxkit.events.signing``) and gives a
``SubscriptionStore`` that checks endpoints with the kit's guard (the
settings' ``OUTBOXKIT_URL_ALLOW_LIST``) and headers against the settings'
secrets.  Build it wherever the kit is built, so ``outboxkit worker``,
which loads the same module, signs too.
"""

from __future__ import annotations

from outboxkit.drain.kit_core import KitCore
from outboxkit.errors import ConfigurationError
from outboxkit.events.catalog import EventTypeCatalog
from outboxkit.events.deliveries import EventDelivery
from outboxkit.events.signing import SubscriptionSecrets, SubscriptionSigningTransport
from outboxkit.events.store import SubscriptionStore

__all__ = ["KitEvents"]


class KitEvents:
    """The kit's subscriptions, event-type catalog and per-subscription signing."""

    def __init__(self, kit: KitCore, *, refresh_seconds: float = 5.0) -> None:
        if EventDelivery not in kit.outboxes:
            raise ConfigurationError(
                "KitEvents needs the deliveries outbox registered with the kit: "
                "OutboxKit(engine, outboxes=[..., EventDelivery])"
            )
        self.kit = kit
        self.subscriptions = SubscriptionStore(
            kit.engine, url_guard=kit.url_guard, secret_names=kit.settings.secrets, clock=kit.clock
        )
        self.catalog = EventTypeCatalog(kit.engine)
        self.secrets = SubscriptionSecrets(kit.engine, refresh_seconds=refresh_seconds)
        kit.drainer(EventDelivery).transport = SubscriptionSigningTransport(kit.transport, self.secrets)
