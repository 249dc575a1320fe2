"""The claim's rows become instances without a Session (outboxkit.storage.row_instances): the same instances the ORM loads.

Real PostgreSQL: the claim itself returns the rows, and the ORM reads the
same rows back to compare with.  A mapping whose loading the direct build
would not reproduce (here a ``@reconstructor``) is loaded by the ORM.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, Integer, Numeric, Text, insert, inspect, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, reconstructor
from sqlalchemy.types import TypeDecorator

from outboxkit import Delivery, Outbox, OutboxOptions
from outboxkit.storage.drain_queries import queries_for
from outboxkit.storage.row_instances import RowInstances


class Base(DeclarativeBase):
    pass


class Cents(TypeDecorator[Decimal]):
    """Stored as whole cents, read as a Decimal amount: a result processor the direct build must apply."""

    impl = Integer
    cache_ok = True

    def process_bind_param(self, value: Decimal | None, dialect: Any) -> int | None:
        return None if value is None else int(value * 100)

    def process_result_value(self, value: int | None, dialect: Any) -> Decimal | None:
        return None if value is None else Decimal(value) / 100


class PricedOutbox(Outbox, Base):
    __tablename__ = "priced_outbox"
    __outbox__ = OutboxOptions(job_name="priced")

    label_text: Mapped[str] = mapped_column("label", Text)  # the attribute is not named as its column
    price: Mapped[Decimal] = mapped_column(Cents)
    ratio: Mapped[Decimal] = mapped_column(Numeric(10, 3))
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/", json={"label": self.label_text, "price": str(self.price)})


class RebuiltOutbox(Outbox, Base):
    __tablename__ = "rebuilt_outbox"
    __outbox__ = OutboxOptions(job_name="rebuilt")

    note: Mapped[str] = mapped_column(Text)

    @reconstructor
    def _loaded(self) -> None:
        self.seen = f"loaded {self.note}"

    def build_delivery(self) -> Delivery:
        return Delivery(url="http://127.0.0.1:1/", json={"seen": self.seen})


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def claim(engine: Engine, outbox: type[Outbox]) -> list[Any]:
    """Every due row, with the drain's claim on an AUTOCOMMIT connection, as the drain runs it."""
    now = datetime.now(timezone.utc) + timedelta(seconds=1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        rows, _ = queries_for(outbox).claim_due_rows(
            connection, now=now, lease_seconds=60, limit=10, token=uuid.uuid4()
        )
    return rows


def test_claimed_rows_are_detached_instances_equal_to_what_the_orm_loads(tables: Engine) -> None:
    values = [
        {"label": "first", "price": Decimal("12.34"), "ratio": Decimal("0.125"), "details": {"n": 1}},
        {"label": "second", "price": Decimal("0.05"), "ratio": Decimal("2"), "details": {}},
    ]
    with Session(tables) as session, session.begin():
        for each in values:  # one by one: ids in this order
            session.add(PricedOutbox(label_text=each["label"], price=each["price"], ratio=each["ratio"],
                                     details=each["details"]))
            session.flush()
    assert RowInstances(PricedOutbox).plain

    claimed = claim(tables, PricedOutbox)

    with Session(tables) as session:
        loaded = {row.id: row for row in session.scalars(select(PricedOutbox))}
        keys = [attribute.key for attribute in inspect(PricedOutbox).column_attrs]
        assert [row.id for row in claimed] == sorted(loaded)  # oldest due first; same due time, then id
        for row in claimed:
            state = inspect(row)
            assert type(row) is PricedOutbox
            assert state.detached and not state.modified and not state.unloaded
            assert state.key == inspect(loaded[row.id]).key
            assert {key: getattr(row, key) for key in keys} == {key: getattr(loaded[row.id], key) for key in keys}
    assert [(row.label_text, row.price, row.ratio, row.details) for row in claimed] == [
        (each["label"], each["price"], each["ratio"], each["details"]) for each in values
    ]
    assert all(row.attempts == 1 and row.claim_token is not None for row in claimed)
    assert claimed[0].build_delivery().json == {"label": "first", "price": "12.34"}


def test_a_mapping_with_a_reconstructor_is_loaded_by_the_orm(tables: Engine) -> None:
    with tables.begin() as connection:
        connection.execute(insert(RebuiltOutbox), [{"note": "a"}, {"note": "b"}])
    assert not RowInstances(RebuiltOutbox).plain

    claimed = claim(tables, RebuiltOutbox)

    assert [row.seen for row in claimed] == ["loaded a", "loaded b"]  # the reconstructor ran, as on any ORM load
    assert all(inspect(row).detached and row.attempts == 1 for row in claimed)
