"""``KitEvents``: events and subscriptions wired to a kit, built by the kit itself.

::

    kit = OutboxKit(engine, outboxes=[Order, EventDelivery])
    kit.events.subscriptions.create(SubscriptionDefinition(...), actor="alice@example.com")

Registering ``EventDelivery`` is all it takes: the kit signs every delivery
of that outbox with its subscription's secrets (``SubscriptionSigningTransport``
under the URL guard of the outbox's drainer, ``outboxkit.events.signing``),
in every process that builds the kit, ``outboxkit worker`` included, and
again after ``kit.close()``.  ``kit.events`` (built on first use) gives a
``SubscriptionStore`` that checks endpoints with the kit's guard (the
settings' ``OUTBOXKIT_URL_ALLOW_LIST``) and headers against the settings'
secrets, the event-type catalog, the replay of stored events to one
subscription (``kit.events.replay``) and the secrets cache the signer reads.

Building ``KitEvents(kit)`` by hand is deprecated: it warns and shares the
kit's own (``kit.events``).
"""

from __future__ import annotations

import warnings

from outboxkit.drain.kit_core import KitCore
from outboxkit.errors import ConfigurationError
from outboxkit.events.catalog import EventTypeCatalog
from outboxkit.events.deliveries import EventDelivery
from outboxkit.events.replay import EventReplay
from outboxkit.events.signing import SubscriptionSecrets, SubscriptionSigningTransport
from outboxkit.events.store import SubscriptionStore
from outboxkit.transports.base import Transport

__all__ = ["KitEvents", "require_deliveries_outbox"]

_DEPRECATED = (
    "KitEvents(kit) is deprecated: the kit builds its events side itself when EventDelivery is registered. "
    "Use kit.events (kit.events.subscriptions, kit.events.catalog) and drop the KitEvents(kit) line"
)


def require_deliveries_outbox(kit: KitCore) -> None:
    """Refuse, saying how to fix it, a kit that does not hold the deliveries outbox."""
    if EventDelivery not in kit.outboxes:
        raise ConfigurationError(
            "events need the deliveries outbox registered with the kit: "
            "OutboxKit(engine, outboxes=[..., EventDelivery])"
        )


class KitEvents:
    """The kit's subscriptions, event-type catalog and per-subscription signing secrets (``kit.events``)."""

    subscriptions: SubscriptionStore
    catalog: EventTypeCatalog
    secrets: SubscriptionSecrets
    replay: EventReplay

    def __init__(self, kit: KitCore, *, refresh_seconds: float = 5.0, _built_by_kit: bool = False) -> None:
        require_deliveries_outbox(kit)
        self.kit = kit
        if not _built_by_kit:
            warnings.warn(_DEPRECATED, DeprecationWarning, stacklevel=2)
            shared = getattr(kit, "events", None)
            if isinstance(shared, KitEvents):  # the kit's own: one store, one catalog, one secrets cache
                self.subscriptions, self.catalog, self.secrets = shared.subscriptions, shared.catalog, shared.secrets
                self.replay = shared.replay
                self.secrets.refresh_seconds = refresh_seconds
                return
        self.subscriptions = SubscriptionStore(
            kit.engine, url_guard=kit.url_guard, secret_names=kit.settings.secrets, clock=kit.clock
        )
        self.catalog = EventTypeCatalog(kit.engine)
        self.replay = EventReplay(kit.engine, clock=kit.clock)
        self.secrets = SubscriptionSecrets(kit.engine, refresh_seconds=refresh_seconds)
        if not _built_by_kit:  # a bare KitCore: sign through this object's secrets
            kit.drainer(EventDelivery).transport = self.signing(kit.transport)

    def signing(self, transport: Transport) -> SubscriptionSigningTransport:
        """``transport`` wrapped to sign each delivery with its subscription's secrets (the drainer guards it)."""
        return SubscriptionSigningTransport(transport, self.secrets)
