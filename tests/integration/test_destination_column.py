"""Every outbox row carries its destination, decided when it is inserted, on every path that inserts one.

The claim reads it (docs/destinations.md), so it must be there whichever way the
row came: the ORM, ``enqueue``/``enqueue_many`` (INSERT and COPY), a Core
``insert()``, a one-shot due later, a schedule's HTTP request.  A table made
before the column is refused when the kit starts, and the migration helper
fills it in for the rows still to be sent.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings, enqueue, enqueue_many
from outboxkit.migrations.helpers import backfill_destinations
from outboxkit.schedules.definitions import ScheduleTrigger
from tests.support.models import SampleEvent, ScheduledCall
from tests.support.schedules import schedules  # noqa: F401  (fixture)

TARGET = "https://Hooks.Example.com/in/events"
DESTINATION = "https://hooks.example.com:443"


def destinations(engine, outbox=SampleEvent) -> list[str | None]:
    with engine.connect() as connection:
        return list(connection.execute(select(outbox.destination).order_by(outbox.id)).scalars())


def test_the_orm_path_stores_the_destination_of_the_delivery(engine):
    with Session(engine) as session, session.begin():
        session.add(SampleEvent(target_url=TARGET))
        session.add(SampleEvent(target_url="http://127.0.0.1:8080/x", next_attempt_at=datetime(2031, 1, 1, tzinfo=timezone.utc)))
    assert destinations(engine) == [DESTINATION, "http://127.0.0.1:8080"]


@pytest.mark.parametrize("copy_threshold", [1, 1000], ids=["copy", "insert"])
def test_the_fast_path_stores_the_destination_of_each_row(engine, copy_threshold):
    later = datetime.now(timezone.utc) + timedelta(days=1)
    with engine.begin() as connection:
        enqueue(connection, SampleEvent, {"target_url": TARGET})
        enqueue_many(
            connection, SampleEvent,
            [{"target_url": f"http://10.0.0.{n}:81/a", "next_attempt_at": later} for n in range(3)],
            copy_threshold=copy_threshold,
        )
    assert destinations(engine) == [DESTINATION] + [f"http://10.0.0.{n}:81" for n in range(3)]


def test_a_core_insert_stores_the_destination_the_outbox_names(engine, monkeypatch):
    monkeypatch.setattr(SampleEvent, "destination_for", lambda self, delivery: f"tenant-{self.payload['tenant']}")
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": TARGET, "payload": {"tenant": t}} for t in "ab"])
        connection.execute(insert(SampleEvent).values(target_url=TARGET, payload={"tenant": "c"}))
    assert destinations(engine) == ["tenant-a", "tenant-b", "tenant-c"]


def test_the_destination_is_not_the_callers_to_set(engine):
    with engine.begin() as connection, pytest.raises(Exception, match="destination"):
        enqueue(connection, SampleEvent, {"target_url": TARGET, "destination": "elsewhere"})


def test_a_row_whose_build_raises_at_insert_has_none_and_the_drain_decides(engine, make_drainer, receiver):
    with Session(engine) as session, session.begin():
        session.add(SampleEvent(target_url=receiver.url + "/a", payload={"raise": True}))
        session.add(SampleEvent(target_url=receiver.url + "/b"))
    assert destinations(engine)[0] is None
    result = make_drainer().drain()
    assert (result.delivered, result.retried) == (1, 1)  # the build's exception is the row's failed attempt


def test_a_schedules_http_request_carries_its_destination(schedules, engine):  # noqa: F811
    schedules.http_schedule("ping", ScheduleTrigger.every(minutes=1), "http://127.0.0.1:9/ping")
    assert schedules.runner().fire_due().enqueued
    assert destinations(engine, ScheduledCall) == ["http://127.0.0.1:9"]


# -- a table made before the column ------------------------------------------------------------


@pytest.fixture
def table_without_the_column(engine):
    with engine.begin() as connection:
        connection.execute(text("DROP INDEX ix_sample_event_outbox_destination_due"))
        connection.execute(text("ALTER TABLE sample_event_outbox DROP COLUMN destination"))
    return engine


def test_the_kit_refuses_to_start_on_a_table_without_the_column(table_without_the_column):
    kit = OutboxKit(table_without_the_column, [SampleEvent], settings=OutboxKitSettings(listen_enabled=False))
    try:
        with pytest.raises(ConfigurationError, match=r"SampleEvent \(sample_event_outbox\).*backfill_destinations"):
            kit.worker.start()
        assert not kit.worker.running
    finally:
        kit.close()


def test_backfill_fills_in_pending_rows_only(table_without_the_column):
    engine = table_without_the_column
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO sample_event_outbox (target_url, payload, status) "
            "SELECT 'http://10.1.0.' || n || '\\:80/x', CASE WHEN n = 4 THEN '{\"raise\": true}' ELSE '{}' END::jsonb, "
            "CASE WHEN n = 5 THEN 'done' ELSE 'pending' END FROM generate_series(1, 5) AS n"
        ))
        connection.execute(text("ALTER TABLE sample_event_outbox ADD COLUMN destination varchar(300)"))
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        assert backfill_destinations(SampleEvent, operations=operations, batch_size=2) == 3
    assert destinations(engine) == ["http://10.1.0.1:80", "http://10.1.0.2:80", "http://10.1.0.3:80", None, None]
