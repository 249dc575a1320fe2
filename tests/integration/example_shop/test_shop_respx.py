"""The shop tested against respx routes: the kit's real HttpTransport, with respx answering instead of the network."""

from __future__ import annotations

import httpx
import pytest

from outboxkit import HttpTransport
from outboxkit.testing import RecordingTransport, UnexpectedSendError, assert_enqueued, drain_until_idle
from tests.integration.example_shop.models import MAILER_URL, WAREHOUSE_URL, OrderPlacedOutbox, ReceiptOutbox
from tests.integration.example_shop.shop import checkout

pytest_plugins = ["outboxkit.pytest_plugin"]


@pytest.fixture
def outboxkit_transport():
    """Every send goes through a real HttpTransport (which respx intercepts) and is recorded on the way."""
    transport = RecordingTransport(forward_to=HttpTransport())
    yield transport
    transport.close()
    transport.check()


def test_respx_answers_the_sends_of_the_kit(outboxkit_engine, outboxkit_kit, respx_mock):
    warehouse = respx_mock.post(f"{WAREHOUSE_URL}/orders").respond(201)
    mailer = respx_mock.post(f"{MAILER_URL}/receipts").mock(side_effect=[httpx.Response(503), httpx.Response(202)])
    order_id = checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")

    report = drain_until_idle(outboxkit_kit)

    assert report.delivered == 2 and report.retried == 1
    assert warehouse.call_count == 1 and mailer.call_count == 2
    request = warehouse.calls.last.request
    [row] = assert_enqueued(outboxkit_engine, OrderPlacedOutbox, status="done")
    assert request.headers["Idempotency-Key"] == str(row.idempotency_key)
    assert request.headers["Content-Type"] == "application/json"
    assert request.read() == b'{"order":%d,"sku":"tea","quantity":2}' % order_id


def test_a_url_without_a_route_fails_the_test(outboxkit_engine, outboxkit_kit, outboxkit_transport, respx_mock):
    respx_mock.post(f"{WAREHOUSE_URL}/orders").respond(201)  # the mailer has no route
    checkout(outboxkit_engine, sku="tea", quantity=2, email="ada@example.test")

    with pytest.raises(UnexpectedSendError, match=r"(?s)POST https://mailer\.example\.test/receipts.*not mocked"):
        drain_until_idle(outboxkit_kit)

    # The attempt failed as a refused connection would, and the row waits for its retry.
    [row] = assert_enqueued(outboxkit_engine, ReceiptOutbox, status="pending")
    assert row.attempts == 1 and "not mocked" in row.last_error
