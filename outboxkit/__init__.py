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

from outboxkit import errors
from outboxkit.clock import Clock, ManualClock, SystemClock
from outboxkit.database import database_url
from outboxkit.drain import Drainer, DrainResult
from outboxkit.enqueue import enqueue, enqueue_many
from outboxkit.errors import *  # noqa: F403  (the whole tree, drawn in outboxkit.errors)
from outboxkit.http_transport import HttpTransport
from outboxkit.jobs import JobContext, calendar_interval, cron, every, once
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox, OutboxOptions, outbox_table_args
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.settings import OutboxKitSettings, OutboxOverride
from outboxkit.transport import CallableTransport, Delivery, Transport
from outboxkit.worker import DrainWorker

__version__ = "0.1.0"

__all__ = [
    # the model
    "Outbox",
    "OutboxOptions",
    "outbox_table_args",
    # writing rows (besides session.add)
    "enqueue",
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
    # scheduled jobs
    "JobContext",
    "calendar_interval",
    "cron",
    "every",
    "once",
]
__all__ += errors.__all__  # the whole error tree, drawn in outboxkit.errors
