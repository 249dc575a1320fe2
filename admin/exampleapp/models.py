"""The example's tables: a business table and two outboxes.

``CreditGrantOutbox`` is the usual shape: the business change (a ``Grant``)
and its outbox row are written in one transaction, and the receiver's URL
comes from the service's configuration.  ``WebhookOutbox`` carries its
target URL on the row, for fan-out to many receivers.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Identity, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxOptions


class Base(DeclarativeBase):
    pass


def receiver_base_url() -> str:
    """Where credit grants are sent (``EXAMPLE_RECEIVER_URL``)."""
    return os.environ.get("EXAMPLE_RECEIVER_URL", "http://127.0.0.1:8765").rstrip("/")


class Grant(Base):
    """A business row: credits granted to a workspace."""

    __tablename__ = "grants"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    workspace: Mapped[str] = mapped_column(String(100))
    amount: Mapped[int] = mapped_column(Integer)
    note: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class CreditGrantOutbox(Outbox, Base):
    """Tells the billing service about each grant."""

    __tablename__ = "credit_grant_outbox"
    __outbox__ = OutboxOptions(job_name="credit-grants")

    grant_id: Mapped[int] = mapped_column(ForeignKey("grants.id"), index=True)
    workspace: Mapped[str] = mapped_column(String(100))
    amount: Mapped[int] = mapped_column(Integer)

    def build_delivery(self) -> Delivery:
        return Delivery(
            url=f"{receiver_base_url()}/grants",
            json={"grant_id": self.grant_id, "workspace": self.workspace, "amount": self.amount},
        )


class WebhookOutbox(Outbox, Base):
    """Generic webhooks: each row names its own target."""

    __tablename__ = "webhook_outbox"
    __outbox__ = OutboxOptions(job_name="webhooks", max_attempts=12)

    event: Mapped[str] = mapped_column(String(100))
    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json={"event": self.event, "data": self.payload})
