"""The one map from a refusal to the HTTP status the admin answers it with, in the JSON API and the pages alike.

A refusal is an ``OutboxKitError`` the operator's service (or the admin's own
input checks) raises when nothing was done: an unknown name, a held row, a
paused outbox, a bad cursor or field, a body over the cap, a query over the
admin's time limit or a wait over its pool timeout.  The API answers
it as JSON (``outboxkit.admin.api.http_errors``), the pages as an error page
(``outboxkit.admin.pages``); both look the status up here.
"""

from __future__ import annotations

from outboxkit.errors import (
    BodyTooLarge,
    InvalidCursor,
    InvalidSearch,
    InvalidValueError,
    MigrationRequired,
    OperatorPoolBusy,
    OperatorQueryTimeout,
    OutboxKitError,
    OutboxPaused,
    PageInputError,
    RowsHeld,
    RowsNotFound,
    RunNowLimited,
    ScheduleDeclaredInCode,
    UnknownDestinationError,
    UnknownJobError,
    UnknownOutboxError,
    UnknownScheduleError,
    UnknownSubscriptionError,
)

__all__ = ["REFUSALS", "REFUSAL_STATUS", "refusal_headers", "refusal_status"]

REFUSAL_STATUS: dict[type[OutboxKitError], int] = {
    UnknownOutboxError: 404,
    UnknownJobError: 404,
    UnknownDestinationError: 404,
    UnknownScheduleError: 404,
    UnknownSubscriptionError: 404,
    RowsNotFound: 404,
    RowsHeld: 409,
    OutboxPaused: 409,
    ScheduleDeclaredInCode: 409,  # changed in the application's code, not here
    InvalidCursor: 400,
    BodyTooLarge: 413,
    RunNowLimited: 429,
    PageInputError: 422,
    InvalidValueError: 422,
    InvalidSearch: 422,
    MigrationRequired: 503,  # the application's deploy is behind the kit's schema: nothing the operator typed is wrong
    # The admin's own limits (outboxkit.storage.operator_pool): the request was too heavy for now, nothing changed.
    OperatorQueryTimeout: 503,
    OperatorPoolBusy: 503,
}
REFUSALS: tuple[type[OutboxKitError], ...] = tuple(REFUSAL_STATUS)  # for ``except REFUSALS``


def refusal_headers(error: OutboxKitError) -> dict[str, str] | None:
    """The headers that go with the refusal's status: ``Retry-After`` on a 429."""
    return {"Retry-After": str(error.retry_after)} if isinstance(error, RunNowLimited) else None


def refusal_status(error: OutboxKitError) -> int:
    """The status for ``error``, one of ``REFUSALS`` (no class in the map derives from another)."""
    return next(status for kind, status in REFUSAL_STATUS.items() if isinstance(error, kind))
