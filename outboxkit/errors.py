"""Exceptions raised by outboxkit.

Every exception the kit raises on purpose derives from ``OutboxKitError``.
Where a builtin is the natural type, the class derives from it too, so code
that catches ``LookupError``, ``ValueError``, ``TypeError`` or
``RuntimeError`` keeps working.  The tree::

    OutboxKitError
    ├── ConfigurationError          a mistake in how the kit, an outbox, a job or a
    │                               setting is set up; raised at start-up (or at
    │                               add_job), the message says how to fix it
    ├── InvalidValueError           (also ValueError) an argument out of range:
    │   │                           ManualClock times, RetryPolicy, AttemptResult...
    │   ├── InvalidDeliveryError    a Delivery with a bad URL, method, header or a
    │   │                           JSON body outboxkit cannot encode (the field is named)
    │   └── InvalidScheduleError    a schedule with a bad trigger, target or limit;
    │                               ``field`` names it (``trigger.timezone``...)
    ├── InvalidTypeError            (also TypeError) an argument, or what a callback
    │                               of yours returned, is of the wrong type
    ├── DeliveryBuildError          (also TypeError) ``build_delivery`` returned
    │                               something that is not a ``Delivery``
    ├── UnknownOutboxError          (also LookupError) a name that matches no
    │                               registered outbox
    ├── UnknownJobError             (also LookupError) a job id that matches no
    │                               registered job
    ├── UnknownScheduleError        (also LookupError) a name that matches no
    │                               schedule row
    ├── LifecycleError              (also RuntimeError) an object used out of order:
    │   │                           started twice, used before it started
    │   └── KitClosedError          the kit (or one of its drainers) is closed
    ├── JobFailed                   raise it from a job to record an ``error``
    │                               outcome with your message and no traceback
    ├── RowsNotFound                (also LookupError; outboxkit.admin) reset named
    │                               rows that do not exist
    ├── RowsHeld                    (outboxkit.admin) reset named rows a drain holds
    └── InvalidCursor               (also ValueError; outboxkit.admin) a page cursor
                                    that does not decode

Delivery failures (timeouts, refused connections, 5xx answers) are not
exceptions: the drain records them on the row as outcomes.  ``drain_once``
never raises into its caller.  Database errors (``sqlalchemy.exc.DBAPIError``)
are SQLAlchemy's own; ``outboxkit.diagnostics`` turns the common ones (a
missing table) into a one-line fix.
"""

from __future__ import annotations

__all__ = [
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
]


class OutboxKitError(Exception):
    """Root of every exception outboxkit raises on purpose."""


class ConfigurationError(OutboxKitError):
    """The kit, an outbox class, a job or a setting is configured wrongly; the message says how to fix it."""


class InvalidValueError(OutboxKitError, ValueError):
    """An argument handed to outboxkit is out of range or of the wrong kind."""


class InvalidDeliveryError(InvalidValueError):
    """A ``Delivery`` was built with a bad URL, method or header, or a JSON body outboxkit cannot encode."""


class InvalidScheduleError(InvalidValueError):
    """A schedule's definition is invalid; ``field`` names the field at fault, e.g. ``trigger.timezone``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidTypeError(OutboxKitError, TypeError):
    """An argument handed to outboxkit, or a value a callback of yours returned, is of the wrong type."""


class DeliveryBuildError(OutboxKitError, TypeError):
    """``build_delivery`` returned something other than a ``Delivery``."""


class UnknownOutboxError(OutboxKitError, LookupError):
    """No outbox is registered under the given name."""


class UnknownJobError(OutboxKitError, LookupError):
    """No job is registered under the given id."""


class UnknownScheduleError(OutboxKitError, LookupError):
    """No schedule row has the given name."""


class LifecycleError(OutboxKitError, RuntimeError):
    """An object was used out of order: started twice, or used before it started."""


class KitClosedError(LifecycleError):
    """The kit (or one of its drainers) has been closed; build a new one."""


class JobFailed(OutboxKitError):
    """Raise from a job to record an ``error`` outcome with this message and no traceback.

    ``quiet=True`` logs it at DEBUG instead of ERROR (the cause was already
    reported elsewhere); the run history records it all the same.
    """

    def __init__(self, message: str, *, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet
