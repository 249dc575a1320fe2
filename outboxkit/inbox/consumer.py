"""Handling one message exactly once: the record, the handler and the commit, in one transaction.

``InboxConsumer.consume(message_id, handler)`` opens a ``Session`` on the
consumer's engine, begins its transaction, records the message
(``outboxkit.inbox.store.record_message``) and, if it is new, calls
``handler(session)`` in that same transaction before committing.  The
outcome is ``"handled"`` or ``"duplicate"``.  If the handler raises, the
transaction rolls back (the record with it, so the next delivery handles the
message again), the failure is counted for the source in a transaction of its
own, and the exception propagates to the caller, which tells the sender to
retry.  Transports (the webhook receiver, a broker's consumer) are thin
layers over this.

Observers (``InboxObserver``) hear each outcome after it is final: a message
handled after its commit, a duplicate after its (empty) commit, a failure
after the rollback.  ``outboxkit.metrics.inbox.InboxMetrics`` is one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from outboxkit.inbox.store import check_message_id, check_source, record_handler_failure, record_message
from outboxkit.telemetry.log_events import log_fields

__all__ = ["ConsumeOutcome", "InboxConsumer", "InboxObserver"]

logger = logging.getLogger(__name__)

ConsumeOutcome = Literal["handled", "duplicate"]


class InboxObserver(Protocol):
    """What an inbox reports, per source, once each outcome is final."""

    def message_handled(self, source: str) -> None: ...

    def duplicate_dropped(self, source: str) -> None: ...

    def handler_failed(self, source: str) -> None: ...


class InboxConsumer:
    """Messages of one ``source``, each handled once, in the consumer's own database ``engine``."""

    def __init__(self, engine: Engine, *, source: str, observers: Iterable[InboxObserver] = ()) -> None:
        self.engine = engine
        self.source = check_source(source)
        self.observers = tuple(observers)

    def consume(self, message_id: str, handler: Callable[[Session], None]) -> ConsumeOutcome:
        """Record ``message_id`` and run ``handler(session)`` in one transaction, unless it was already handled.

        Returns ``"handled"`` after the commit, ``"duplicate"`` without calling
        the handler.  A handler that raises rolls back its writes and the
        record, is counted as a failure, and its exception is raised again.
        """
        check_message_id(message_id)
        try:
            with Session(self.engine) as session, session.begin():
                if not record_message(session, source=self.source, message_id=message_id):
                    outcome: ConsumeOutcome = "duplicate"
                else:
                    handler(session)
                    outcome = "handled"
        except Exception as exc:
            self.count_failure(message_id, exc)
            raise
        for observer in self.observers:
            if outcome == "handled":
                observer.message_handled(self.source)
            else:
                observer.duplicate_dropped(self.source)
        return outcome

    def count_failure(self, message_id: str, exc: Exception) -> None:
        """Log and count a message that was not handled (``consume`` calls it; so does a consumer that cannot start one)."""
        logger.warning(
            "inbox %s: message %s was not handled (%s: %s); its writes rolled back, the sender retries",
            self.source, message_id, type(exc).__name__, exc,
            extra=log_fields("inbox.handler_failed", None, source=self.source, message_id=message_id),
        )
        try:
            record_handler_failure(self.engine, source=self.source, error=f"{type(exc).__name__}: {exc}")
        except Exception:  # the database may be why the handler failed; the count is best effort
            logger.warning(
                "inbox %s: could not count the failure", self.source, exc_info=True,
                extra=log_fields("inbox.failure_not_counted", None, source=self.source),
            )
        for observer in self.observers:
            observer.handler_failed(self.source)
