"""The transport of requests whose URL does not come from the application's code (a schedule's HTTP target).

``GuardedTransport`` wraps the kit's transport for every
``ScheduledRequestOutbox`` (``KitCore.drainer``).  Each send:

1. puts each secret a header references (``secret:NAME``) in its place, from
   the settings (``outboxkit.target_secrets``); a secret the settings lack
   is a ``refused`` attempt, like a refused URL;
2. checks the URL again with the kit's ``UrlGuard`` (``outboxkit.url_guard``),
   its lookup bounded by the send's deadline: a schedule saved while its host
   was public may resolve to a private address now.  A refusal is the
   attempt's ``refused`` outcome, so the row becomes ``stuck`` at once with
   the reason in ``last_error``, and no connection is opened;
3. sends the delivery pinned to the address that was checked
   (``Delivery.pinned_to``), with what is left of the deadline;
4. redacts, in what the attempt history keeps of the exchange
   (``outboxkit.transports.exchange``), every header it filled from a secret,
   whatever its name, and keeps no more of the answer's body there than
   ``last_error`` shows;
5. shortens what an error answer shows: the body of a non-2xx answer is left
   out of ``last_error`` (it is shown in the admin, its API and exports, and
   the receiver may be anything a person typed), unless
   ``error_body_chars`` (``OUTBOXKIT_SCHEDULE_ERROR_BODY_CHARS``) asks for
   that many of its first characters.

Redirects are answers like any other (``HttpTransport`` follows none), so a
3xx leaves the row ``stuck``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from outboxkit.errors import UnsafeUrlError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.target_secrets import resolve_headers
from outboxkit.transports.base import Delivery, Transport
from outboxkit.transports.exchange import redacted_headers
from outboxkit.url_guard import UrlGuard

__all__ = ["GuardedTransport"]

MAX_ERROR_BODY_CHARS = 500


class GuardedTransport:
    """Sends through ``transport`` only what ``guard`` lets through, to the address it checked."""

    def __init__(
        self, transport: Transport, *, guard: UrlGuard, error_body_chars: int = 0, secrets: Mapping[str, str] | None = None
    ) -> None:
        self.transport = transport
        self.guard = guard
        self.error_body_chars = error_body_chars
        self._secrets = dict(secrets or {})

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        started = time.monotonic()
        headers, missing = resolve_headers(delivery.headers, self._secrets)
        if missing is not None:
            return AttemptResult(failure=FailureKind.REFUSED, error=f"refused before sending: {missing}")
        try:
            checked = self.guard.check(delivery.url, timeout=timeout)
        except UnsafeUrlError as exc:
            return AttemptResult(failure=FailureKind.REFUSED, error=f"refused before sending: {exc}")
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: the name lookup took the whole {timeout:g} s")
        # The secrets' values were checked as header values by the settings; the stored row keeps their names.
        sent = delivery.with_headers(headers).pinned_to(checked.address)
        result = self.transport.send(sent, idempotency_key=idempotency_key, timeout=left)
        from_secrets = [name for name, value in delivery.headers.items() if headers.get(name) != value]
        return self._shortened(self._redacted(result, from_secrets))

    def _redacted(self, result: AttemptResult, from_secrets: list[str]) -> AttemptResult:
        """What the attempt history keeps of the exchange: the headers filled from secrets redacted, whatever
        their names, and no more of the answer's body than ``last_error`` shows."""
        if result.exchange is None:
            return result
        exchange = redacted_headers(result.exchange, from_secrets, excerpt_bytes=self.error_body_chars)
        return dataclasses.replace(result, exchange=exchange)

    def _shortened(self, result: AttemptResult) -> AttemptResult:
        code = result.status_code
        if code is None or result.succeeded or result.error is None:
            return result
        status = f"HTTP {code}"
        body = result.error.removeprefix(status).removeprefix(": ")
        shown = body[: self.error_body_chars]
        error = f"{status}: {shown}" if shown else status
        return AttemptResult(status_code=code, error=error, retry_after=result.retry_after, exchange=result.exchange)

    def close(self) -> None:
        self.transport.close()
