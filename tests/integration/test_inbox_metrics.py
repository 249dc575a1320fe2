"""The inbox's Prometheus metrics, fed by a consumer: one count per final outcome, per source."""

from __future__ import annotations

import pytest

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.inbox import InboxConsumer
from outboxkit.metrics.prometheus import OutboxMetrics
from tests.support.inbox import apply, create_applied_table
from tests.support.models import SampleEvent


def test_handled_duplicates_and_failures_are_counted_per_source(engine):
    create_applied_table(engine)
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(listen_enabled=False))
    metrics = OutboxMetrics(kit, refresh_seconds=3600)
    try:
        billing = InboxConsumer(engine, source="billing", observers=[metrics.inbox])
        shipping = InboxConsumer(engine, source="shipping", observers=[metrics.inbox])
        billing.consume("m-1", lambda session: apply(session, "b-1"))
        billing.consume("m-1", lambda session: apply(session, "b-1"))
        shipping.consume("m-1", lambda session: apply(session, "s-1"))

        def failing(session: object) -> None:
            raise RuntimeError("no")

        with pytest.raises(RuntimeError):
            shipping.consume("m-2", failing)

        def value(name: str, **labels: str) -> float | None:
            return metrics.registry.get_sample_value(name, labels)

        assert value("outboxkit_inbox_messages_total", source="billing", outcome="handled") == 1
        assert value("outboxkit_inbox_messages_total", source="billing", outcome="duplicate") == 1
        assert value("outboxkit_inbox_messages_total", source="shipping", outcome="handled") == 1
        assert value("outboxkit_inbox_messages_total", source="shipping", outcome="handler_failed") == 1
        assert value("outboxkit_inbox_messages_total", source="shipping", outcome="duplicate") is None
        assert (value("outboxkit_inbox_last_handled_timestamp_seconds", source="billing") or 0) > 0
    finally:
        metrics.close()
        kit.close()
