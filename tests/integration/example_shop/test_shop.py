"""The shop's own tests, written as an application would write them: only outboxkit.testing and its fixtures."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from outboxkit.testing import assert_enqueued, drain_until_idle, outbox_rows, reply, timeout
from tests.integration.example_shop.models import MAILER_URL, WAREHOUSE_URL, Order, OrderPlacedOutbox, ReceiptOutbox
from tests.integration.example_shop.shop import checkout, place_order

# The entry point loads the plugin already; this line is what a project with autoloading off writes.
pytest_plugins = ["outboxkit.pytest_plugin"]

WAREHOUSE = f"{WAREHOUSE_URL}/orders"


def test_checkout_writes_the_order_and_one_row_for_each_receiver(outboxkit_engine):
    order_id = checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")

    [row] = assert_enqueued(outboxkit_engine, OrderPlacedOutbox, where={"order_id": order_id, "sku": "tea", "quantity": 2})
    assert row.status == "pending" and row.attempts == 0
    assert row.build_delivery().json == {"order": order_id, "sku": "tea", "quantity": 2}
    assert_enqueued(outboxkit_engine, ReceiptOutbox, where={"order_id": order_id, "email": "ada@example.test"})


def test_a_refused_order_writes_no_outbox_row(outboxkit_engine):
    with pytest.raises(ValueError), Session(outboxkit_engine) as session, session.begin():
        place_order(session, sku="tea", quantity=0, email="ada@example.test")

    assert_enqueued(outboxkit_engine, OrderPlacedOutbox, count=0)
    assert_enqueued(outboxkit_engine, ReceiptOutbox, count=0)


def test_the_rows_are_in_the_transaction_of_the_order(outboxkit_engine):
    with Session(outboxkit_engine) as session:
        order = place_order(session, sku="tea", quantity=1, email="ada@example.test")
        assert_enqueued(session, OrderPlacedOutbox, where={"order_id": order.id})  # the session sees its own rows
        session.rollback()

    assert outbox_rows(outboxkit_engine, OrderPlacedOutbox) == []
    assert outbox_rows(outboxkit_engine, Order) == []


def test_the_warehouse_and_the_mailer_receive_the_order_once_with_its_key(outboxkit_engine, outboxkit_kit, outboxkit_transport):
    order_id = checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")

    report = drain_until_idle(outboxkit_kit)

    assert report.delivered == 2 and report.retried == 0 and report.stuck == 0
    [shipped] = outboxkit_transport.sends_for(OrderPlacedOutbox)
    [row] = outbox_rows(outboxkit_engine, OrderPlacedOutbox, status="done")
    assert (shipped.method, shipped.url) == ("POST", WAREHOUSE)
    assert shipped.json == {"order": order_id, "sku": "tea", "quantity": 2}
    assert shipped.headers["X-Shop"] == "example"
    assert shipped.idempotency_key == str(row.idempotency_key) == shipped.headers["Idempotency-Key"]
    [receipt] = outboxkit_transport.sends_for(ReceiptOutbox)
    assert receipt.url == f"{MAILER_URL}/receipts" and receipt.json == {"order": order_id, "to": "ada@example.test"}


def test_a_flaky_warehouse_is_retried_through_the_backoff_table(outboxkit_engine, outboxkit_kit, outboxkit_transport):
    checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")
    outboxkit_transport.queue(503, timeout(), 201, url=WAREHOUSE)

    report = drain_until_idle(outboxkit_kit)

    sends = outboxkit_transport.sends_for(OrderPlacedOutbox)
    assert [send.result.status_code for send in sends] == [503, None, 201]
    assert len({send.idempotency_key for send in sends}) == 1  # every attempt carries the row's key
    assert report.retried == 2 and report.delivered == 2  # the order (third attempt) and the receipt
    assert report.advanced >= timedelta(seconds=5 + 30)  # the first two steps of the shop's backoff table
    [row] = outbox_rows(outboxkit_engine, OrderPlacedOutbox)
    assert (row.status, row.attempts) == ("done", 3)


def test_a_warehouse_that_rejects_the_order_leaves_it_stuck(outboxkit_engine, outboxkit_kit, outboxkit_transport):
    checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")
    outboxkit_transport.always(reply(422, body="unknown sku"), url=WAREHOUSE)

    report = drain_until_idle(outboxkit_kit)

    assert report.stuck == 1
    [row] = assert_enqueued(outboxkit_engine, OrderPlacedOutbox, status="stuck")
    assert row.last_status_code == 422 and "unknown sku" in row.last_error


def test_a_warehouse_that_stays_down_runs_out_of_attempts(outboxkit_engine, outboxkit_kit, outboxkit_transport):
    checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")
    outboxkit_transport.always(503, url=WAREHOUSE)

    report = drain_until_idle(outboxkit_kit)

    assert len(outboxkit_transport.sends_for(OrderPlacedOutbox)) == 4  # max_attempts of the outbox
    [row] = assert_enqueued(outboxkit_engine, OrderPlacedOutbox, status="stuck")
    assert "max attempts" in row.last_error
    assert report.advanced >= timedelta(seconds=5 + 30 + 120)
