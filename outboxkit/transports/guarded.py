"""The transport of requests whose URL does not come from the application's code (a schedule's HTTP target).

``GuardedTransport`` wraps the kit's transport for every
``ScheduledRequestOutbox`` (``KitCore.drainer``).  Each send:

1. checks the URL again with the kit's ``UrlGuard`` (``outboxkit.url_guard``),
   its lookup bounded by the send's deadline: a schedule saved while its host
   was public may resolve to a private address now.  A refusal is the
   attempt's ``refused`` outcome, so the row becomes ``stuck`` at once with
   the reason in ``last_error``, and no connection is opened;
2. sends the delivery pinned to the address that was checked
   (``Delivery.pinned_to``), with what is left of the deadline;
3. shortens what an error answer shows: the body of a non-2xx answer is left
   out of ``last_error`` (it is shown in the admin, its API and exports, and
   the receiver may be anything a person typed), unless
   ``error_body_chars`` (``OUTBOXKIT_SCHEDULE_ERROR_BODY_CHARS``) asks for
   that many of its first characters.

Redirects are answers like any other (``HttpTransport`` follows none), so a
3xx leaves the row ``stuck``.
"""

from __future__ import annotations

import time

from outboxkit.errors import UnsafeUrlError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery, Transport
from outboxkit.url_guard import UrlGuard

__all__ = ["GuardedTransport"]

MAX_ERROR_BODY_CHARS = 500


class GuardedTransport:
    """Sends through ``transport`` only what ``guard`` lets through, to the address it checked."""

    def __init__(self, transport: Transport, *, guard: UrlGuard, error_body_chars: int = 0) -> None:
        self.transport = transport
        self.guard = guard
        self.error_body_chars = error_body_chars

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        started = time.monotonic()
        try:
            checked = self.guard.check(delivery.url, timeout=timeout)
        except UnsafeUrlError as exc:
            return AttemptResult(failure=FailureKind.REFUSED, error=f"refused before sending: {exc}")
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: the name lookup took the whole {timeout:g} s")
        result = self.transport.send(delivery.pinned_to(checked.address), idempotency_key=idempotency_key, timeout=left)
        return self._shortened(result)

    def _shortened(self, result: AttemptResult) -> AttemptResult:
        code = result.status_code
        if code is None or result.succeeded or result.error is None:
            return result
        status = f"HTTP {code}"
        body = result.error.removeprefix(status).removeprefix(": ")
        shown = body[: self.error_body_chars]
        error = f"{status}: {shown}" if shown else status
        return AttemptResult(status_code=code, error=error, retry_after=result.retry_after)

    def close(self) -> None:
        self.transport.close()
