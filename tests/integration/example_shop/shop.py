"""The shop's business code: placing an order writes the order and its outbox rows in one transaction."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.integration.example_shop.models import Order, OrderPlacedOutbox, ReceiptOutbox


def place_order(session: Session, *, sku: str, quantity: int, email: str) -> Order:
    """Record an order and announce it to the warehouse and the mailer, in the caller's transaction."""
    if quantity < 1:
        raise ValueError(f"an order needs a quantity of at least 1, got {quantity}")
    order = Order(sku=sku, quantity=quantity, email=email)
    session.add(order)
    session.flush()  # the order's id goes into the outbox rows
    session.add(OrderPlacedOutbox(order_id=order.id, sku=sku, quantity=quantity))
    session.add(ReceiptOutbox(order_id=order.id, email=email))
    return order


def checkout(engine: Engine, *, sku: str, quantity: int, email: str) -> int:
    """What the shop's HTTP handler does: one transaction per order.  Returns the order's id."""
    with Session(engine) as session, session.begin():
        return place_order(session, sku=sku, quantity=quantity, email=email).id
