"""Exceptions raised by outboxkit.

Every exception the kit raises on purpose derives from ``OutboxKitError``.
Where a builtin is the natural type, the class derives from it too, so code
that catches ``LookupError``, ``ValueError``, ``TypeError`` or
``RuntimeError`` keeps working.  The tree::

    OutboxKitError
    ├── ConfigurationError          a mistake in how the kit, an outbox, a job or a
    │   │                           setting is set up; raised at start-up (or at
    │   │                           add_job), the message says how to fix it
    │   └── MigrationRequired       (operator) the kit's tables lack a migration that an
    │                               action needs; the message names it; nothing was changed
    ├── InvalidValueError           (also ValueError) an argument out of range:
    │   │                           ManualClock times, RetryPolicy, AttemptResult...
    │   ├── InvalidDeliveryError    a Delivery with a bad URL, method, header or a
    │   │                           JSON body outboxkit cannot encode (the field is named)
    │   ├── InvalidScheduleError    a schedule with a bad trigger, target or limit;
    │   │                           ``field`` names it (``trigger.timezone``...)
    │   ├── InvalidSubscriptionError a subscription with a bad endpoint, filter, secret or
    │   │                           header; ``field`` names it (``url``, ``secrets``...)
    │   ├── InvalidEventError       an event refused by publish: an unknown type, a payload
    │   │                           too large or against its type's schema; ``field`` names it
    │   ├── UnsafeUrlError          a URL that does not come from code may not be sent to:
    │   │                           not http(s), credentials in it, or a non-public address
    │   │                           outside OUTBOXKIT_URL_ALLOW_LIST (outboxkit.url_guard)
    │   └── NotOrderedError         (operator) skip or blocked keys asked of an outbox
    │                               without an ordering key; nothing was changed
    ├── InvalidSearch               (also ValueError; operator) a search that is neither
    │                               a row id nor an idempotency key
    ├── InvalidCursor               (also ValueError; operator) a page cursor that does
    │                               not decode, or belongs to another listing
    ├── PageInputError              (also ValueError; admin pages) a malformed query or
    │                               form field
    ├── InvalidTypeError            (also TypeError) an argument, or what a callback
    │                               of yours (a JobSource...) returned, is of the wrong type
    ├── DeliveryBuildError          (also TypeError) ``build_delivery`` returned
    │                               something that is not a ``Delivery``
    ├── UnknownOutboxError          (also LookupError) a name that matches no
    │                               registered outbox
    ├── UnknownJobError             (also LookupError) a job id that matches no
    │                               registered job
    ├── RowsNotFound                (also LookupError; operator) reset or retry named
    │                               rows that do not exist; nothing was changed
    ├── RowsHeld                    (operator) reset or retry named rows a drain holds;
    │                               nothing was changed
    ├── OutboxPaused                (operator) drain now or retry an outbox whose
    │                               drains are paused; nothing was done
    ├── RunNowLimited               (operator) one person asked "run now" more often than
    │                               OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE; nothing was done
    ├── BodyTooLarge                (admin) a request body over the admin's cap
    ├── InvalidWebhookSignature     (inbox) a webhook whose signature, id or timestamp does
    │                               not verify against the receiver's secrets; nothing was written
    ├── OperatorQueryTimeout        (operator) a transaction of the admin or the CLI ran
    │                               past OUTBOXKIT_ADMIN_STATEMENT_TIMEOUT_SECONDS and was
    │                               cancelled; it changed nothing: narrow the filter
    ├── OperatorPoolBusy            (operator) every connection of the admin's own pool
    │                               stayed in use for OUTBOXKIT_ADMIN_POOL_TIMEOUT_SECONDS
    ├── UnknownScheduleError        (also LookupError) a name that matches no
    │                               schedule row
    ├── UnknownSubscriptionError    (also LookupError) an id that matches no
    │                               subscription row
    ├── ScheduleDeclaredInCode      (operator) an edit or delete of a schedule declared in
    │                               code; the message says where; nothing was changed
    ├── UnknownDestinationError     (also LookupError; operator) a destination name with
    │                               no state in that outbox; nothing was changed
    ├── LifecycleError              (also RuntimeError) an object used out of order:
    │   │                           started twice, used before it started
    │   └── KitClosedError          a drainer used after ``close()``
    ├── JobFailed                   raise it from a job to record an ``error``
    │                               outcome with your message and no traceback
    └── OutboxAssertionError        (also AssertionError; outboxkit.testing) assert_enqueued
        │                           found other rows than expected
        ├── UnexpectedSendError     a send the test did not plan for
        └── NotIdleError            drain_until_idle did not reach idle, or a drain failed

The operator's errors are raised by ``outboxkit.operations`` (shared by the
admin and the CLI); the admin answers each with the HTTP status of
``outboxkit.admin.refusals``.  The package root exports the errors an
application meets; the others are importable from here and from the module
that raises them.

Delivery failures (timeouts, refused connections, 5xx answers) are not
exceptions: the drain records them on the row as outcomes.  ``drain_once``
never raises into its caller.  Database errors (``sqlalchemy.exc.DBAPIError``)
are SQLAlchemy's own; ``outboxkit.storage.diagnostics`` turns the common ones (a
missing table) into a one-line fix.
"""

from __future__ import annotations

__all__ = [
    "BodyTooLarge",
    "ConfigurationError",
    "DeliveryBuildError",
    "InvalidCursor",
    "InvalidDeliveryError",
    "InvalidEventError",
    "InvalidSearch",
    "InvalidScheduleError",
    "InvalidSubscriptionError",
    "InvalidTypeError",
    "InvalidValueError",
    "InvalidWebhookSignature",
    "JobFailed",
    "KitClosedError",
    "LifecycleError",
    "MigrationRequired",
    "NotIdleError",
    "NotOrderedError",
    "OperatorPoolBusy",
    "OperatorQueryTimeout",
    "OutboxAssertionError",
    "OutboxKitError",
    "OutboxPaused",
    "PageInputError",
    "RowsHeld",
    "RowsNotFound",
    "ScheduleDeclaredInCode",
    "RunNowLimited",
    "UnexpectedSendError",
    "UnknownJobError",
    "UnknownOutboxError",
    "UnknownScheduleError",
    "UnknownSubscriptionError",
    "UnsafeUrlError",
]


class OutboxKitError(Exception):
    """Root of every exception outboxkit raises on purpose."""


class ConfigurationError(OutboxKitError):
    """The kit, an outbox class, a job or a setting is configured wrongly; the message says how to fix it."""


class MigrationRequired(ConfigurationError):
    """The kit's tables lack a migration that an operator's action needs; the message names it; nothing was changed."""


class InvalidValueError(OutboxKitError, ValueError):
    """An argument handed to outboxkit is out of range or of the wrong kind."""


class InvalidDeliveryError(InvalidValueError):
    """A ``Delivery`` was built with a bad URL, method or header, or a JSON body outboxkit cannot encode."""


class InvalidScheduleError(InvalidValueError):
    """A schedule's definition is invalid; ``field`` names the field at fault, e.g. ``trigger.timezone``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidSubscriptionError(InvalidValueError):
    """A subscription's definition is invalid; ``field`` names the field at fault, e.g. ``url`` or ``secrets``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidEventError(InvalidValueError):
    """``publish`` refused an event; ``field`` names what is wrong (``event_type``, ``payload.amount``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnsafeUrlError(InvalidValueError):
    """A URL that does not come from the application's code may not be sent to (``outboxkit.url_guard``)."""


class NotOrderedError(InvalidValueError):
    """Skip or blocked keys were asked of an outbox that has no ordering key (``OutboxOptions.ordering_key``)."""


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


class UnknownSubscriptionError(OutboxKitError, LookupError):
    """No subscription row has the given id."""


class ScheduleDeclaredInCode(OutboxKitError):
    """An edit or delete of a schedule declared in code: the code writes it again at every start, so it is changed
    there.  ``declared_at`` is where (``module:line``), when the row knows it; enable, disable and run now work."""

    def __init__(self, name: str, declared_at: str | None, *, action: str) -> None:
        self.name = name
        self.declared_at = declared_at
        where = f"at {declared_at}" if declared_at else "(kit.schedules.add_job or add_http)"
        change = (
            "remove its declaration there and deploy to delete it, or disable it here" if action == "delete"
            else "change it there and deploy"
        )
        super().__init__(
            f"schedule {name!r} is declared in code {where} and written again from the code at every start: "
            f"{change}; nothing was changed. Enable, disable and run now work here."
        )


class UnknownDestinationError(OutboxKitError, LookupError):
    """An operator named a destination that has no state in that outbox (a typo, or one that never failed)."""

    def __init__(
        self, outbox: str, destination: str, known: list[str],
        *, why: str = "a destination is listed once it has failed (or was disabled)",
    ) -> None:
        self.outbox = outbox
        self.destination = destination
        shown = ", ".join(repr(name) for name in known[:10]) + (", ..." if len(known) > 10 else "")
        super().__init__(
            f"outbox {outbox!r} has no destination {destination[:300]!r}: {why}; nothing was changed. "
            + (f"Its destinations: {shown}." if known else "It has none yet.")
        )


class LifecycleError(OutboxKitError, RuntimeError):
    """An object was used out of order: started twice, or used before it started."""


class KitClosedError(LifecycleError):
    """A drainer was used after ``close()`` (its thread pool is gone).

    ``OutboxKit.close()`` itself leaves the kit usable: the kit's next drain
    builds a fresh drainer.  Only a ``Drainer`` object kept from before the
    close raises this; ask the kit for its drainer again.
    """


class JobFailed(OutboxKitError):
    """Raise from a job to record an ``error`` outcome with this message and no traceback.

    ``quiet=True`` logs it at DEBUG instead of ERROR (the cause was already
    reported elsewhere); the run history records it all the same.
    """

    def __init__(self, message: str, *, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet


# -- raised by the operator's service (outboxkit.operations), the admin and the CLI --------------


class InvalidSearch(OutboxKitError, ValueError):
    """A search that is neither a row id nor an idempotency key."""


class InvalidCursor(OutboxKitError, ValueError):
    """The cursor does not decode, or belongs to another listing."""


class PageInputError(OutboxKitError, ValueError):
    """An admin page's query or form field is malformed (answered 422)."""


class RowsNotFound(OutboxKitError, LookupError):
    """Some requested ids are not rows of the outbox."""

    def __init__(self, outbox: str, ids: list[int]) -> None:
        self.ids = ids
        super().__init__(f"outbox {outbox!r} has no row with id {', '.join(map(str, ids[:20]))}")


class RowsHeld(OutboxKitError):
    """Some requested rows are held by a drain right now; nothing was changed."""

    def __init__(self, outbox: str, ids: list[int]) -> None:
        self.ids = ids
        super().__init__(
            f"a drain holds row(s) {', '.join(map(str, ids[:20]))} of {outbox!r} (delivery in flight); "
            "nothing was changed, try again when the delivery has finished"
        )


class OutboxPaused(OutboxKitError):
    """The outbox's drains are paused; resume them first."""

    def __init__(self, outbox: str) -> None:
        super().__init__(f"the drains of {outbox!r} are paused; resume them first (nothing was done)")


class RunNowLimited(OutboxKitError):
    """One person asked "run now" more often than the limit allows; nothing was done (answered 429)."""

    def __init__(self, actor: str, limit: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"{actor[:100]!r} may run schedules now at most {limit} times a minute "
            f"(OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE); nothing was done, try again in {retry_after} s"
        )


class BodyTooLarge(OutboxKitError):
    """A request body is over the admin's cap (answered 413)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the request body is larger than {limit:,} bytes; nothing was changed")


class InvalidWebhookSignature(OutboxKitError):
    """A webhook the inbox refused before its transaction: a missing header, a stale timestamp, no matching signature."""


class OperatorQueryTimeout(OutboxKitError):
    """An operator's transaction (admin or CLI) ran past its time limit and was cancelled; it changed nothing."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(
            f"the query took longer than the admin's time limit of {seconds:g} s "
            "(OUTBOXKIT_ADMIN_STATEMENT_TIMEOUT_SECONDS) and was cancelled; nothing was changed. "
            "Narrow the filter (a longer text, a status code, a time range) and try again"
        )


class OperatorPoolBusy(OutboxKitError):
    """Every connection of the admin's own pool stayed in use for the pool timeout; nothing was done."""

    def __init__(self, pool_size: int, seconds: float) -> None:
        super().__init__(
            f"all {pool_size} of the admin's database connections (OUTBOXKIT_ADMIN_POOL_SIZE) stayed busy for "
            f"{seconds:g} s; nothing was done. Try again in a moment, or narrow the filter of the slow requests"
        )


# -- raised by the testing kit (outboxkit.testing) ------------------------------------------------


class OutboxAssertionError(OutboxKitError, AssertionError):
    """A testing-kit check failed; the message says what was expected and what is there."""


class UnexpectedSendError(OutboxAssertionError):
    """A send the test did not plan for (strict mode, or the forwarded transport raised, e.g. respx's "not mocked")."""


class NotIdleError(OutboxAssertionError):
    """``drain_until_idle`` did not reach idle: rows stayed due for ``max_rounds`` rounds, or a drain failed."""


# Two helpers for turning an error into text; not part of ``__all__``, which lists the error tree alone.


def first_line(error: BaseException | None) -> str:
    """The first non-blank line of ``error``'s message, or its type's name when the message is blank.

    Database and network errors run to several lines (a query, a hint, a traceback of the server's);
    log lines, ``last_error`` and the operator's screens take the first.
    """
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def error_summary(error: BaseException) -> str:
    """``Type: first line`` of ``error``, or the type's name alone when the message is blank."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
