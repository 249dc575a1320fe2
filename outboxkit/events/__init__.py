"""Events and subscriptions: one published event delivered to every endpoint that subscribed to it.

What it owns:

* ``definitions.py``: a subscription as data (``SubscriptionDefinition``), checked before anything is written;
* ``store.py``: the subscription rows (``SubscriptionStore``: create, edit, enable, disable, delete, audited),
  what each change does to the deliveries not yet sent;
* ``subscription_limits.py``: each subscription's own limits, kept as its destination's limits
  (``outboxkit.destinations.limits``);
* ``publish.py``: ``publish`` / ``publish_with``, the event and its deliveries in the caller's transaction, one
  ``INSERT ... SELECT``; ``publish_async.py``: the same on an ``AsyncSession``, awaited on the loop;
* ``replay.py``: stored events sent again to one subscription (a dry run counts them), and test events;
* ``deliveries.py``: ``EventDelivery``, the kit's deliveries outbox (an ordinary outbox of requests typed at
  run time, so guarded and redacted);
* ``signing.py``: each delivery signed with its own subscription's secrets at send time;
* ``catalog.py``, ``schema_check.py``: event types and their JSON Schemas (``jsonschema``, the ``events`` extra);
* ``runtime.py``: ``KitEvents`` (``kit.events``), all of it wired to a kit, which builds it when
  ``EventDelivery`` is registered.

Invariants: an event and its deliveries commit with the caller's change or not at all; a subscription
receives only events published after it committed; every endpoint passes the URL guard at save and at send;
nothing undelivered is deleted (a deleted subscription's pending deliveries end ``stuck``).
Start reading at ``publish.py``, then ``store.py``.
"""

from outboxkit.events.catalog import EventTypeCatalog
from outboxkit.events.definitions import SubscriptionDefinition
from outboxkit.events.deliveries import EventDelivery
from outboxkit.events.publish import Published, publish, publish_with
from outboxkit.events.publish_async import publish_async, publish_async_with
from outboxkit.events.replay import EventReplay, ReplayResult
from outboxkit.events.runtime import KitEvents
from outboxkit.events.signing import SubscriptionSecrets, SubscriptionSigningTransport
from outboxkit.events.store import Subscription, SubscriptionStore

__all__ = [
    "EventDelivery",
    "EventReplay",
    "EventTypeCatalog",
    "KitEvents",
    "Published",
    "ReplayResult",
    "Subscription",
    "SubscriptionDefinition",
    "SubscriptionSecrets",
    "SubscriptionSigningTransport",
    "SubscriptionStore",
    "publish",
    "publish_async",
    "publish_async_with",
    "publish_with",
]
