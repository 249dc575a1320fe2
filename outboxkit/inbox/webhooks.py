"""The webhook receiver: a FastAPI route that verifies, records, handles, then answers.

::

    from outboxkit.inbox.webhooks import WebhookMessage, WebhookReceiver

    def credit(session: Session, message: WebhookMessage) -> None:
        session.add(Credit(account=message.payload["account"], amount=message.payload["amount"]))

    receiver = WebhookReceiver(engine, source="billing", secrets=settings.billing_secrets, handler=credit)
    app.include_router(receiver.router("/webhooks/billing"))

Each request goes through these steps, in order; each answer says what the
sender should do:

0. **read** the body, at most ``max_body_bytes`` (1 MiB by default).  Larger:
   ``413``, nothing written.
1. **verify** the Standard Webhooks signature (``outboxkit.inbox.verify``:
   the receiver's secrets, the timestamp tolerance).  Refused: ``401``,
   nothing written, no transaction opened.
2. **parse** the body as JSON.  Not JSON, or a ``webhook-id`` too long for
   the inbox: ``400``, nothing written.
3. **record and handle** in one transaction (``outboxkit.inbox.consumer``):
   the inbox record, then ``handler(session, message)`` with the consumer's
   writes, then the commit.  Already handled: ``200 {"status": "duplicate"}``
   and the handler does not run.  Handled: ``200 {"status": "handled"}``
   after the commit.
4. A handler that raises (or a database that fails) rolls the transaction
   back: ``500`` (``503`` when the database cannot be reached), so the
   sender retries and the retry handles the message.

The database work runs on a thread (``run_in_threadpool``), so the event loop
never waits on it.  This module imports FastAPI and Starlette (the ``admin``
extra); ``standardwebhooks`` is imported by ``outboxkit.inbox.verify``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from outboxkit.clock import Clock
from outboxkit.errors import ConfigurationError, InvalidWebhookSignature
from outboxkit.inbox.consumer import ConsumeOutcome, InboxConsumer, InboxObserver
from outboxkit.inbox.store import MESSAGE_ID_LIMIT
from outboxkit.inbox.verify import DEFAULT_TOLERANCE_SECONDS, WebhookVerifier

__all__ = ["DEFAULT_MAX_BODY_BYTES", "WebhookHandler", "WebhookMessage", "WebhookReceiver"]

DEFAULT_MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class WebhookMessage:
    """A verified webhook: its id (the sender's idempotency key), when it was signed, its JSON and its raw body."""

    message_id: str
    timestamp: datetime
    payload: Any
    body: bytes = field(repr=False)


WebhookHandler = Callable[[Session, WebhookMessage], None]


class WebhookReceiver:
    """Receives the webhooks of one ``source``; ``handler(session, message)`` runs once per message.

    ``engine`` is the consumer's own database (sync psycopg), where the
    handler's writes and the inbox record go.  ``secrets`` are the
    ``whsec_...`` secrets accepted (several while rotating);
    ``tolerance_seconds`` how far a request's timestamp may be from
    ``clock``.  ``observers`` hear each outcome (e.g. ``InboxMetrics``).
    A body over ``max_body_bytes`` is refused before it is read whole.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        source: str,
        secrets: Sequence[str],
        handler: WebhookHandler,
        tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
        clock: Clock | None = None,
        observers: Iterable[InboxObserver] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ConfigurationError(f"max_body_bytes must be a positive number of bytes, got {max_body_bytes!r}")
        self.max_body_bytes = max_body_bytes
        self.verifier = WebhookVerifier(secrets, tolerance_seconds=tolerance_seconds, clock=clock)
        self.consumer = InboxConsumer(engine, source=source, observers=observers)
        self.handler = handler

    @property
    def source(self) -> str:
        return self.consumer.source

    def router(self, path: str, **route_options: Any) -> APIRouter:
        """An ``APIRouter`` with one ``POST path`` route answering as the module docstring says."""
        router = APIRouter()
        router.add_api_route(path, self.endpoint, methods=["POST"], response_class=JSONResponse, **route_options)
        return router

    async def endpoint(self, request: Request) -> JSONResponse:
        """The route itself, for applications that mount it their own way."""
        body = await self._read_body(request)
        if body is None:
            return JSONResponse({"detail": f"the body is larger than {self.max_body_bytes:,} bytes"}, status_code=413)
        try:
            verified = self.verifier.verify(body, request.headers)
        except InvalidWebhookSignature as exc:
            return JSONResponse({"detail": str(exc)}, status_code=401)
        if len(verified.message_id) > MESSAGE_ID_LIMIT or not verified.message_id.isprintable():
            return JSONResponse(
                {"detail": f"webhook-id must be 1 to {MESSAGE_ID_LIMIT} printable characters"}, status_code=400
            )
        try:
            payload = json.loads(body)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            return JSONResponse({"detail": "the body is not JSON"}, status_code=400)
        message = WebhookMessage(message_id=verified.message_id, timestamp=verified.timestamp, payload=payload, body=body)
        try:
            outcome = await run_in_threadpool(self.receive, message)
        except (OperationalError, InterfaceError):  # the connection, not a statement of the handler's
            return JSONResponse({"detail": "the database is unavailable; retry"}, status_code=503)
        except Exception:
            return JSONResponse({"detail": "the handler failed; retry"}, status_code=500)
        return JSONResponse({"status": outcome})

    async def _read_body(self, request: Request) -> bytes | None:
        """The body, or None as soon as it is known to be over the cap (declared, or as it arrives)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def receive(self, message: WebhookMessage) -> ConsumeOutcome:
        """Record and handle a verified message in one transaction (steps 3 and 4), without HTTP."""
        return self.consumer.consume(message.message_id, lambda session: self.handler(session, message))
