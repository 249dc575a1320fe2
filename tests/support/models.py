"""Outbox classes used only by the tests.

``SampleEvent`` sends its ``payload`` to ``target_url``.  A payload with
``"raise": true`` makes ``build_delivery`` raise; ``"poison": true`` is what
the worker script treats as a delivery that kills its process.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, String, Text, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxOptions
from outboxkit.schedules.requests import ScheduledRequestOutbox


class SampleBase(DeclarativeBase):
    pass


class SampleEvent(Outbox, SampleBase):
    __tablename__ = "sample_event_outbox"
    __outbox__ = OutboxOptions(job_name="sample-events", max_attempts=5, backoff=(1, 2, 4))

    target_url: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(50), default="event", server_default="event")
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        if self.payload.get("raise"):
            raise ValueError(f"cannot build row {self.id}: bad payload")
        return Delivery(url=self.target_url, json=self.payload, headers={"X-Kind": self.kind})


class ScheduledCall(ScheduledRequestOutbox, SampleBase):
    """Carries the HTTP requests of schedules (tests/test_schedule_*.py)."""

    __tablename__ = "scheduled_call_outbox"
    __outbox__ = OutboxOptions(job_name="scheduled-calls", max_attempts=3, backoff=(1, 2))


class OrderedEvent(Outbox, SampleBase):
    """Delivered in order per ``stream`` (tests/integration/test_ordered_delivery.py); a NULL stream is unordered."""

    __tablename__ = "ordered_event_outbox"
    __outbox__ = OutboxOptions(job_name="ordered-events", max_attempts=5, backoff=(1, 2, 4), ordering_key="stream")

    target_url: Mapped[str] = mapped_column(Text)
    stream: Mapped[str | None] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        # The ordering key is the message key too, as docs/transports.md shows: a broker keeps one key's messages in order.
        return Delivery(url=self.target_url, json=self.payload, key=self.stream)


def unclaimed_sample_events(engine: Engine, url: str) -> int:
    """``SampleEvent`` rows addressed under ``url`` that no claim holds now (never claimed, recorded or given back)."""
    with engine.connect() as connection:
        return int(connection.execute(
            select(func.count()).where(SampleEvent.target_url.startswith(url), SampleEvent.claimed_until.is_(None))
        ).scalar_one())
