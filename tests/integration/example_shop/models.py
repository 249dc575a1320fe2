"""The shop's models: orders, and two outboxes that announce each order (to the warehouse and to the mailer)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Identity, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxOptions

WAREHOUSE_URL = "https://warehouse.example.test"
MAILER_URL = "https://mailer.example.test"


class ShopBase(DeclarativeBase):
    pass


class Order(ShopBase):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int] = mapped_column(Integer)
    email: Mapped[str] = mapped_column(String(200))


class OrderPlacedOutbox(Outbox, ShopBase):
    """Tells the warehouse to ship an order."""

    __tablename__ = "shop_order_placed_outbox"
    __outbox__ = OutboxOptions(job_name="shop-order-placed", backoff=(5, 30, 120), max_attempts=4)

    order_id: Mapped[int] = mapped_column(BigInteger)
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int] = mapped_column(Integer)

    def build_delivery(self) -> Delivery:
        return Delivery(
            url=f"{WAREHOUSE_URL}/orders",
            json={"order": self.order_id, "sku": self.sku, "quantity": self.quantity},
            headers={"X-Shop": "example"},
        )


class ReceiptOutbox(Outbox, ShopBase):
    """Asks the mailer to send the receipt."""

    __tablename__ = "shop_receipt_outbox"
    __outbox__ = OutboxOptions(job_name="shop-receipts")

    order_id: Mapped[int] = mapped_column(BigInteger)
    email: Mapped[str] = mapped_column(String(200))

    def build_delivery(self) -> Delivery:
        return Delivery(url=f"{MAILER_URL}/receipts", json={"order": self.order_id, "to": self.email})
