"""outboxkit: durable delivery from a PostgreSQL outbox table.

Write a row into an outbox in the same transaction as your business change;
outboxkit delivers it (HTTP first) with retries on a backoff table, parks it
as ``stuck`` where retrying cannot help, and never deletes a row it has not
delivered.
"""

from outboxkit.clock import Clock, ManualClock, SystemClock
from outboxkit.drain import Drainer, DrainResult, drain_once
from outboxkit.errors import ConfigurationError, DeliveryBuildError, OutboxKitError, UnknownOutboxError
from outboxkit.http_transport import HttpTransport
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox, OutboxOptions, outbox_table_args
from outboxkit.policy import AttemptResult, Decision, FailureKind, RetryPolicy
from outboxkit.settings import OutboxKitSettings, OutboxOverride
from outboxkit.transport import CallableTransport, Delivery, Transport

__version__ = "0.1.0"

__all__ = [
    "AttemptResult",
    "CallableTransport",
    "Clock",
    "ConfigurationError",
    "Decision",
    "Delivery",
    "DeliveryBuildError",
    "DrainResult",
    "Drainer",
    "FailureKind",
    "HttpTransport",
    "ManualClock",
    "Outbox",
    "OutboxKit",
    "OutboxKitError",
    "OutboxKitSettings",
    "OutboxOptions",
    "OutboxOverride",
    "RetryPolicy",
    "SystemClock",
    "Transport",
    "UnknownOutboxError",
    "drain_once",
    "outbox_table_args",
]
