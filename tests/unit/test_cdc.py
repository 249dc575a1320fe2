"""An outbox relayed by change data capture (``relay="cdc"``): the kit never drains it; refusals of bad declarations."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Session

from outboxkit import ConfigurationError, OutboxKit, OutboxOptions
from outboxkit.drain.worker import DrainWorker
from outboxkit.leader.scheduler import drain_job_id
from outboxkit.model import Outbox
from outboxkit.storage.debezium import DebeziumColumns, capture
from tests.support.models import SampleEvent


class CdcBase(DeclarativeBase):
    pass


class ShipmentEvent(DebeziumColumns, Outbox, CdcBase):
    # No build_delivery: a connector sends these rows, the kit does not.
    __tablename__ = "shipment_events"
    __outbox__ = OutboxOptions(job_name="shipment-events", relay="cdc")


def test_a_cdc_outbox_is_neither_drained_by_the_worker_nor_given_a_drain_job():
    kit = OutboxKit(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"), [SampleEvent, ShipmentEvent])

    assert kit.outboxes == [SampleEvent, ShipmentEvent]
    assert kit.drained_outboxes == [SampleEvent]
    assert DrainWorker(kit).outboxes == [SampleEvent]
    job_ids = {job.id for job in kit.scheduler.jobs()}
    assert drain_job_id(SampleEvent) in job_ids and drain_job_id(ShipmentEvent) not in job_ids


def test_an_unknown_relay_is_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match="relay must be one of 'drain', 'cdc', got 'debezium'"):
        OutboxOptions(job_name="x", relay="debezium")


def test_an_outbox_the_kit_drains_still_needs_build_delivery():
    with pytest.raises(ConfigurationError, match="must implement build_delivery"):
        class Undeliverable(Outbox, CdcBase):
            __tablename__ = "undeliverable"
            __outbox__ = OutboxOptions(job_name="undeliverable")


def test_capture_refuses_a_row_of_an_outbox_the_kit_drains_and_writes_nothing():
    session = Session()  # bound to nothing: a write would fail
    with pytest.raises(ConfigurationError, match="capture\\(\\) is for an outbox declared OutboxOptions\\(relay='cdc'\\)"):
        capture(session, SampleEvent(target_url="https://example.com/", payload={}))
    assert not session.new
