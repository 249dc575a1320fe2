"""``Delivery.json`` through a real drain: column values arrive as the documented strings, a naive datetime fails the attempt.

The encoding rules themselves are pinned in tests/unit/test_transport.py.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from sqlalchemy import Boolean, Engine, Numeric, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Delivery, Outbox, OutboxKit, OutboxOptions

# -- through a real drain ----------------------------------------------------------


class PricedBase(DeclarativeBase):
    pass


class PriceChange(Outbox, PricedBase):
    """Sends a Decimal price and an aware timestamp read from its columns; ``naive`` drops the time zone."""

    __tablename__ = "price_change_outbox"
    __outbox__ = OutboxOptions(job_name="price-changes", max_attempts=3, backoff=(60,))
    RECEIVER = "http://127.0.0.1:1"

    price: Mapped[Decimal] = mapped_column(Numeric(12, 4))
    naive: Mapped[bool] = mapped_column(Boolean, default=False)

    def build_delivery(self) -> Delivery:
        at = self.created_at.replace(tzinfo=None) if self.naive else self.created_at
        return Delivery(url=f"{self.RECEIVER}/prices", json={"price": self.price, "changed": {"at": at}})


@pytest.fixture
def price_engine(engine: Engine, receiver, monkeypatch) -> Engine:
    PricedBase.metadata.create_all(engine)
    monkeypatch.setattr(PriceChange, "RECEIVER", receiver.url)
    return engine


def test_a_real_drain_sends_a_decimal_and_an_aware_datetime_as_documented(price_engine, receiver, clock):
    with Session(price_engine) as session, session.begin():
        session.add(PriceChange(price=Decimal("19.9900")))
    with OutboxKit(price_engine, [PriceChange], clock=clock) as kit:
        assert kit.drain_once(PriceChange).delivered == 1
    [request] = receiver.requests
    assert request.body["price"] == "19.9900"
    sent_at = datetime.fromisoformat(request.body["changed"]["at"])
    with Session(price_engine) as session:
        assert sent_at == session.scalars(select(PriceChange.created_at)).one()
    assert sent_at.utcoffset() is not None


def test_a_naive_datetime_fails_the_attempt_with_the_field_named(price_engine, receiver, clock):
    with Session(price_engine) as session, session.begin():
        session.add(PriceChange(price=Decimal("1"), naive=True))
    with OutboxKit(price_engine, [PriceChange], clock=clock) as kit:
        result = kit.drain_once(PriceChange)
    assert (result.claimed, result.delivered) == (1, 0)
    assert receiver.requests == []
    with Session(price_engine) as session:
        row = session.scalars(select(PriceChange)).one()
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.last_error.startswith("build_delivery raised InvalidDeliveryError: Delivery.json cannot be encoded as JSON: ")
    assert "Delivery.json['changed']['at'] is a naive datetime" in row.last_error
