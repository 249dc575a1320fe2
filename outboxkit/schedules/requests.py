"""The outbox that carries a schedule's HTTP requests.

A schedule whose target is an ``HttpTarget`` is fired by inserting one row
into the outbox its target names, in the transaction that advances the
schedule (``outboxkit.schedules.runner``).  That outbox is an ordinary one,
drained like any other (retries, backoff, ``stuck``, idempotency key), whose
rows hold the request as data::

    class ScheduledCall(ScheduledRequestOutbox, Base):
        __tablename__ = "scheduled_call_outbox"
        __outbox__ = OutboxOptions(job_name="scheduled-calls")

An application declares one such class (or several, to give requests their
own backoff or transport), creates its table with its own migrations as for
any outbox, and registers it with the kit.  Each row also records which
schedule and which occurrence (``schedule_name``, ``scheduled_for``) put it
there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from outboxkit.model import Outbox
from outboxkit.transports.base import Delivery

__all__ = ["ScheduledRequestOutbox"]


class ScheduledRequestOutbox(Outbox):
    """An outbox whose rows are HTTP requests written as data (method, URL, headers, JSON body)."""

    __abstract__ = True
    __runtime_requests__ = ("url", "headers")

    schedule_name: Mapped[str] = mapped_column(String(200))
    scheduled_for: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    method: Mapped[str] = mapped_column(String(8))
    url: Mapped[str] = mapped_column(Text)
    headers: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    body: Mapped[Any] = mapped_column(JSONB, nullable=True)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.url, method=self.method, headers=self.headers, json=self.body)
