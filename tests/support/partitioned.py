"""Partitioned outboxes for the partitioning tests, each in metadata of its own (not in the shared template).

``PartitionedEvent`` is a daily-partitioned outbox sending its ``payload`` to ``target_url``;
``PlainTable`` and ``ConvertedTable`` are the same table (``converted_outbox``) before and after
``convert_to_partitioned``.  ``create_partitioned_event_table`` builds ``PartitionedEvent``'s table as a
migration would (``create_partitioned_outbox``) in a test's database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxOptions
from outboxkit.migrations.helpers import create_partitioned_outbox, install_notify_triggers


class PartitionedBase(DeclarativeBase):
    pass


class PartitionedEvent(Outbox, PartitionedBase):
    __tablename__ = "partitioned_event_outbox"
    __outbox__ = OutboxOptions(
        job_name="partitioned-events", max_attempts=5, backoff=(1, 2, 4), partition_by="day", retain_done_for=86400
    )

    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json=self.payload)


class ConvertedShape(Outbox):
    """The columns ``converted_outbox`` has before and after the conversion."""

    __abstract__ = True

    target_url: Mapped[str] = mapped_column(Text)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url)


class PlainBase(DeclarativeBase):
    pass


class PlainTable(ConvertedShape, PlainBase):
    __tablename__ = "converted_outbox"
    __outbox__ = OutboxOptions(job_name="converted")


class ConvertedBase(DeclarativeBase):
    pass


class ConvertedTable(ConvertedShape, ConvertedBase):
    __tablename__ = "converted_outbox"
    __outbox__ = OutboxOptions(job_name="converted", partition_by="week")


def migrate(engine: Engine, upgrade: Any) -> None:
    """Run ``upgrade(operations)`` as a revision's ``upgrade()`` would, on one connection, and commit."""
    with engine.connect() as connection:
        upgrade(Operations(MigrationContext.configure(connection)))
        connection.commit()


def create_partitioned_event_table(engine: Engine, *, now: datetime | None = None) -> None:
    """``PartitionedEvent``'s table, its partitions around ``now`` and its NOTIFY trigger, as a revision makes them."""

    def upgrade(operations: Operations) -> None:
        create_partitioned_outbox(PartitionedEvent, operations=operations, now=now)
        install_notify_triggers(PartitionedEvent, operations=operations)

    migrate(engine, upgrade)
