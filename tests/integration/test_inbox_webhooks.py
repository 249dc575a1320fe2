"""The webhook receiver against real PostgreSQL: verify, record, handle, answer.

Senders: outboxkit's own (a signed outbox drained over HTTP, and ``SigningTransport``
directly) and the ``standardwebhooks`` package's signer, the reference any other
Standard Webhooks sender agrees with.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
import standardwebhooks
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from outboxkit import Delivery, ManualClock
from outboxkit.errors import ConfigurationError
from outboxkit.inbox.webhooks import WebhookMessage, WebhookReceiver
from outboxkit.testing import RecordingTransport
from outboxkit.transports.signing import SigningTransport, WebhookSecrets
from tests.support.admin import ServedApp
from tests.support.database import sqlalchemy_url
from tests.support.inbox import applied, apply, create_applied_table, records

OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"x" * 32).decode()


@pytest.fixture
def business(engine):
    create_applied_table(engine)
    return engine


def handle(session: Session, message: WebhookMessage) -> None:
    if message.payload.get("fail"):
        raise RuntimeError("the handler refuses")
    apply(session, message.message_id)


def client_for(engine, *, secrets=(NEW_SECRET,), clock=None, handler=handle, **options) -> TestClient:
    receiver = WebhookReceiver(engine, source="billing", secrets=list(secrets), handler=handler, clock=clock, **options)
    app = FastAPI()
    app.include_router(receiver.router("/webhooks/billing"))
    return TestClient(app)


def reference_signed(message_id: str, body: bytes, *, secret: str = NEW_SECRET, at: datetime | None = None) -> dict[str, str]:
    """Headers as the standardwebhooks package's own signer makes them."""
    at = at or datetime.now(timezone.utc)
    signature = standardwebhooks.Webhook(secret).sign(msg_id=message_id, timestamp=at, data=body)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": signature}


def kit_signed(message_id: str, payload: dict, *secrets: str) -> tuple[bytes, dict[str, str]]:
    """Body and headers as outboxkit's SigningTransport sends them."""
    signer = SigningTransport(RecordingTransport(), WebhookSecrets(list(secrets)))
    delivery = signer.sign(Delivery(url="http://127.0.0.1/unused", json=payload), idempotency_key=message_id)
    return delivery.body() or b"", dict(delivery.headers)


def nothing_written(engine) -> bool:
    with engine.connect() as connection:
        sources = connection.execute(text("SELECT count(*) FROM outboxkit_inbox_sources")).scalar()
    return records(engine) == set() and applied(engine) == {} and sources == 0


# -- senders ---------------------------------------------------------------------


def test_a_signed_outbox_drained_over_http_is_handled_once(business, make_drainer, insert_events, read_events):
    receiver = WebhookReceiver(business, source="billing", secrets=[NEW_SECRET], handler=handle)
    app = FastAPI()
    app.include_router(receiver.router("/webhooks/billing"))
    with ServedApp(app) as base_url:
        ids = insert_events([{"n": n} for n in range(5)])
        with business.begin() as connection:  # aim them at the served receiver
            connection.execute(text("UPDATE sample_event_outbox SET target_url = :url"), {"url": base_url + "/webhooks/billing"})
        drainer = make_drainer(sign_webhooks=True, webhook_secrets=[NEW_SECRET])
        assert drainer.drain_once().delivered == 5
    rows = read_events()
    assert all(rows[row_id].status == "done" for row_id in ids)
    keys = {str(rows[row_id].idempotency_key) for row_id in ids}
    assert applied(business) == {key: 1 for key in keys}
    assert records(business) == {("billing", key) for key in keys}


def test_the_kits_signing_transport_and_the_reference_signer_are_both_accepted(business):
    client = client_for(business)
    body, headers = kit_signed("kit-1", {"amount": 5}, NEW_SECRET)
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "handled"}
    body = json.dumps({"amount": 7}).encode()
    answer = client.post("/webhooks/billing", content=body, headers=reference_signed("ref-1", body))
    assert (answer.status_code, answer.json()) == (200, {"status": "handled"})
    assert applied(business) == {"kit-1": 1, "ref-1": 1}


def test_a_duplicate_is_acknowledged_without_running_the_handler(business):
    client = client_for(business)
    body, headers = kit_signed("m-1", {"amount": 5}, NEW_SECRET)
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "handled"}
    later_body, later_headers = kit_signed("m-1", {"amount": 5}, NEW_SECRET)  # a retry: signed again
    answer = client.post("/webhooks/billing", content=later_body, headers=later_headers)
    assert (answer.status_code, answer.json()) == (200, {"status": "duplicate"})
    assert applied(business) == {"m-1": 1}


# -- rotation and refusals ----------------------------------------------------------


@pytest.mark.parametrize(
    ("receiver_secrets", "sender_secrets", "status"),
    [
        ((OLD_SECRET, NEW_SECRET), (OLD_SECRET,), 200),  # the sender has not switched yet
        ((OLD_SECRET, NEW_SECRET), (NEW_SECRET,), 200),  # it has
        ((NEW_SECRET,), (OLD_SECRET, NEW_SECRET), 200),  # it signs with both while rotating
        ((NEW_SECRET,), (OLD_SECRET,), 401),  # the receiver dropped the old one too early
    ],
)
def test_several_secrets_rotate_without_a_refused_request(business, receiver_secrets, sender_secrets, status):
    client = client_for(business, secrets=receiver_secrets)
    body, headers = kit_signed("m-1", {"amount": 5}, *sender_secrets)
    assert client.post("/webhooks/billing", content=body, headers=headers).status_code == status


@pytest.mark.parametrize(
    "tamper",
    [
        lambda body, headers: (body + b" ", headers),  # body changed on the way
        lambda body, headers: (body, {**headers, "webhook-id": "other"}),  # id changed
        lambda body, headers: (body, {k: v for k, v in headers.items() if k != "webhook-signature"}),
        lambda body, headers: (body, {**headers, "webhook-timestamp": "soon"}),
        lambda body, headers: (body, {**headers, "webhook-signature": "v1," + "A" * 44}),
        lambda body, headers: (body, {}),
    ],
)
def test_an_invalid_signature_is_401_and_writes_nothing(business, tamper):
    client = client_for(business)
    body, headers = tamper(*kit_signed("m-1", {"amount": 5}, NEW_SECRET))
    answer = client.post("/webhooks/billing", content=body, headers=headers)
    assert answer.status_code == 401 and answer.json()["detail"]
    assert nothing_written(business)


def test_another_senders_secret_is_refused(business):
    body, headers = kit_signed("m-1", {"amount": 5}, OTHER_SECRET)
    assert client_for(business).post("/webhooks/billing", content=body, headers=headers).status_code == 401
    assert nothing_written(business)


@pytest.mark.parametrize("offset", [timedelta(seconds=-301), timedelta(seconds=301)])
def test_a_timestamp_beyond_the_tolerance_is_refused(business, offset):
    now = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
    client = client_for(business, clock=ManualClock(now))
    body = b'{"amount": 1}'
    beyond = reference_signed("m-1", body, at=now + offset)
    assert client.post("/webhooks/billing", content=body, headers=beyond).status_code == 401
    within = reference_signed("m-1", body, at=now + offset * 0.99)
    assert client.post("/webhooks/billing", content=body, headers=within).status_code == 200


@pytest.mark.parametrize("body", [b"not json", b'{"amount": ', b"\xff\xfe"])
def test_a_malformed_body_is_400_and_writes_nothing(business, body):
    answer = client_for(business).post("/webhooks/billing", content=body, headers=reference_signed("m-1", body))
    assert answer.status_code == 400 and "JSON" in answer.json()["detail"]
    assert nothing_written(business)


def test_an_id_too_long_for_the_inbox_is_400(business):
    body = b"{}"
    answer = client_for(business).post("/webhooks/billing", content=body, headers=reference_signed("m" * 301, body))
    assert answer.status_code == 400 and "webhook-id" in answer.json()["detail"]
    assert nothing_written(business)


def test_a_body_over_the_cap_is_413_and_writes_nothing(business):
    client = client_for(business, max_body_bytes=100)
    body, headers = kit_signed("m-1", {"padding": "x" * 200}, NEW_SECRET)
    assert client.post("/webhooks/billing", content=body, headers=headers).status_code == 413

    def chunks():  # no Content-Length: the cap holds as the body arrives
        yield body[:60]
        yield body[60:]

    assert client.post("/webhooks/billing", content=chunks(), headers=headers).status_code == 413
    assert nothing_written(business)
    small_body, small_headers = kit_signed("m-2", {"amount": 1}, NEW_SECRET)
    assert client.post("/webhooks/billing", content=small_body, headers=small_headers).json() == {"status": "handled"}


@pytest.mark.parametrize("cap", [0, -1, True, 1.5])
def test_a_bad_cap_is_refused_at_start_up(business, cap):
    with pytest.raises(ConfigurationError, match="max_body_bytes"):
        WebhookReceiver(business, source="billing", secrets=[NEW_SECRET], handler=handle, max_body_bytes=cap)


# -- failures ----------------------------------------------------------------------------


def test_a_handler_error_is_500_rolls_back_and_the_retry_is_handled(business):
    calls: list[str] = []

    def flaky(session: Session, message: WebhookMessage) -> None:
        calls.append(message.message_id)
        apply(session, message.message_id)
        if len(calls) == 1:
            raise RuntimeError("the ledger is closed")

    client = client_for(business, handler=flaky)
    body, headers = kit_signed("m-1", {"amount": 5}, NEW_SECRET)
    answer = client.post("/webhooks/billing", content=body, headers=headers)
    assert answer.status_code == 500 and records(business) == set() and applied(business) == {}
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "handled"}
    assert applied(business) == {"m-1": 1} and calls == ["m-1", "m-1"]
    with business.connect() as connection:
        failures = connection.execute(text("SELECT handler_failures FROM outboxkit_inbox_sources")).scalar()
    assert failures == 1


def test_a_failing_statement_of_the_handler_is_500_not_503(business):
    def broken(session: Session, message: WebhookMessage) -> None:
        session.execute(text("INSERT INTO no_such_table VALUES (1)"))

    body, headers = kit_signed("m-1", {"amount": 5}, NEW_SECRET)
    assert client_for(business, handler=broken).post("/webhooks/billing", content=body, headers=headers).status_code == 500
    assert records(business) == set()


def test_an_unreachable_database_is_503_so_the_sender_retries(database_url):
    missing = create_engine(sqlalchemy_url(database_url.rsplit("/", 1)[0] + "/outboxkit_no_such_database"))
    try:
        body, headers = kit_signed("m-1", {"amount": 5}, NEW_SECRET)
        answer = client_for(missing).post("/webhooks/billing", content=body, headers=headers)
        assert answer.status_code == 503
    finally:
        missing.dispose()
