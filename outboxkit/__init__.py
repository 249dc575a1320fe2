"""outboxkit: durable delivery from a PostgreSQL outbox table.

Write a row into an outbox in the same transaction as your business change;
outboxkit delivers it (HTTP first) with retries on a backoff table, parks it
as ``stuck`` where retrying cannot help, and never deletes a row it has not
delivered.

Everything an application needs is importable from here (``__all__``);
``outboxkit.admin`` (the admin router), ``outboxkit.testing`` and the
modules' own names (``outboxkit.drain``, ``outboxkit.policy``...) serve the
rest.
"""

from outboxkit.clock import Clock, ManualClock, SystemClock
from outboxkit.drain.drainer import Drainer
from outboxkit.drain.worker import DrainWorker
from outboxkit.enqueue import enqueue, enqueue_async, enqueue_many
from outboxkit.errors import (  # the errors an application meets; the whole tree is drawn in outboxkit.errors
    ConfigurationError,
    DeliveryBuildError,
    InvalidDeliveryError,
    InvalidEventError,
    InvalidScheduleError,
    InvalidSubscriptionError,
    InvalidTypeError,
    InvalidValueError,
    JobFailed,
    KitClosedError,
    LifecycleError,
    OutboxKitError,
    UnknownJobError,
    UnknownOutboxError,
    UnknownScheduleError,
    UnknownSubscriptionError,
)
from outboxkit.events import EventDelivery, KitEvents, SubscriptionDefinition, publish
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox, OutboxOptions, outbox_table_args
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.results import DrainResult
from outboxkit.schedules.jobs import JobContext, calendar_interval, cron, every, once
from outboxkit.settings import OutboxKitSettings, OutboxOverride
from outboxkit.storage.database import database_url
from outboxkit.transports.base import CallableTransport, Delivery, Transport
from outboxkit.transports.http import HttpTransport
from outboxkit.version import VERSION

__version__ = VERSION

__all__ = [
    # the model
    "Outbox",
    "OutboxOptions",
    "outbox_table_args",
    # writing rows (besides session.add)
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    # what to send, and how it is sent
    "AttemptResult",
    "CallableTransport",
    "Delivery",
    "FailureKind",
    "HttpTransport",
    "Transport",
    # the kit, its settings and its database
    "DrainResult",
    "DrainWorker",
    "Drainer",
    "OutboxKit",
    "OutboxKitSettings",
    "OutboxOverride",
    "database_url",
    # time
    "Clock",
    "ManualClock",
    "SystemClock",
    # events published to subscriptions
    "EventDelivery",
    "KitEvents",
    "SubscriptionDefinition",
    "publish",
    # scheduled jobs
    "JobContext",
    "calendar_interval",
    "cron",
    "every",
    "once",
    # errors (the operator's and the testing kit's are in outboxkit.errors too)
    "ConfigurationError",
    "DeliveryBuildError",
    "InvalidDeliveryError",
    "InvalidScheduleError",
    "InvalidTypeError",
    "InvalidValueError",
    "JobFailed",
    "KitClosedError",
    "LifecycleError",
    "OutboxKitError",
    "UnknownJobError",
    "UnknownOutboxError",
    "UnknownScheduleError",
    "InvalidSubscriptionError",
    "InvalidEventError",
    "UnknownSubscriptionError",
]
