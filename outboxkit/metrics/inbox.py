"""The inbox's Prometheus metrics: messages per source by outcome, and when one was last handled.

::

    metrics = OutboxMetrics(kit)
    receiver = WebhookReceiver(engine, source="billing", secrets=..., handler=..., observers=[metrics.inbox])

``InboxMetrics`` is an ``outboxkit.inbox.InboxObserver``: the receiver (or an
``InboxConsumer``) tells it each outcome once it is final.  Like the attempt
counters they count what *this process* did; sum them across processes::

    outboxkit_inbox_messages_total{source, outcome}       outcome: handled, duplicate, handler_failed
    outboxkit_inbox_last_handled_timestamp_seconds{source}  Unix time of this process's last handled message

A rising share of ``duplicate`` means senders retry messages already handled:
answers lost on the way back (timeouts, a proxy), or a sender that no longer
records its outcomes (the alert ``OutboxkitInboxDuplicatesRising`` in
docs/alerts.yml).  ``OutboxMetrics`` builds one in its own registry
(``metrics.inbox``); build another with ``InboxMetrics(prometheus, registry)``.
The sources are the application's own names, so the series stay few.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["INBOX_OUTCOMES", "InboxMetrics"]

INBOX_OUTCOMES = ("handled", "duplicate", "handler_failed")


class InboxMetrics:
    """The inbox metrics in ``registry``, made with the ``prometheus`` module ``outboxkit.metrics`` imported."""

    def __init__(self, prometheus: Any, registry: Any) -> None:
        self.messages = prometheus.Counter(
            "outboxkit_inbox_messages", "Inbox messages by source and outcome (handled, duplicate, handler_failed)",
            ["source", "outcome"], registry=registry,
        )
        self.last_handled = prometheus.Gauge(
            "outboxkit_inbox_last_handled_timestamp_seconds", "Unix time this process last handled a message of the source",
            ["source"], registry=registry,
        )

    def message_handled(self, source: str) -> None:
        self.messages.labels(source=source, outcome="handled").inc()
        self.last_handled.labels(source=source).set(time.time())

    def duplicate_dropped(self, source: str) -> None:
        self.messages.labels(source=source, outcome="duplicate").inc()

    def handler_failed(self, source: str) -> None:
        self.messages.labels(source=source, outcome="handler_failed").inc()
