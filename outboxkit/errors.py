"""Exceptions raised by outboxkit.

The tree::

    OutboxKitError
    ├── ConfigurationError      a mistake in how the kit or an outbox is set up;
    │                           raised at start-up, the message says how to fix it
    ├── UnknownOutboxError      a name that matches no registered outbox
    ├── DeliveryBuildError      the application's ``build_delivery`` returned
    │                           something that is not a ``Delivery``
    └── KitClosedError          the kit or a drainer was used after ``close()``
                                (also a ``RuntimeError``)

Delivery failures (timeouts, refused connections, 5xx answers) are not
exceptions: the drain records them on the row as outcomes.  ``drain_once``
never raises into its caller.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DeliveryBuildError",
    "KitClosedError",
    "OutboxKitError",
    "UnknownOutboxError",
]


class OutboxKitError(Exception):
    """Root of every exception outboxkit raises on purpose."""


class ConfigurationError(OutboxKitError):
    """The kit, an outbox class or a setting is configured wrongly."""


class UnknownOutboxError(OutboxKitError, LookupError):
    """No outbox is registered under the given name."""


class DeliveryBuildError(OutboxKitError, TypeError):
    """``build_delivery`` returned something other than a ``Delivery``."""


class KitClosedError(OutboxKitError, RuntimeError):
    """A drainer was used after ``close()``."""
