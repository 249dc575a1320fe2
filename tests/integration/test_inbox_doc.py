"""docs/inbox.md's receiver, run as written: a signed webhook is credited once, a retry is a duplicate."""

from __future__ import annotations

import base64
import importlib
import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from outboxkit import Delivery
from outboxkit.testing import RecordingTransport
from outboxkit.transports.signing import SigningTransport, WebhookSecrets
from tests.support.database import sqlalchemy_url
from tests.support.doc_pages import PAGE_RECEIVER_URL, create_schema, forget_package, page_files, write_package

SECRETS = ["whsec_" + base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2)]


@pytest.fixture
def page_app(tmp_path, monkeypatch, database_url):
    write_package(tmp_path, page_files("inbox.md"), receiver_url=PAGE_RECEIVER_URL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))
    monkeypatch.setenv("BILLING_WEBHOOK_SECRETS", ",".join(SECRETS))
    models = importlib.import_module("myinbox.models")
    engine = create_engine(sqlalchemy_url(database_url))
    create_schema(engine, models.Base.metadata, [])
    try:
        application = importlib.import_module("myinbox.app")
        with TestClient(application.app) as client:
            yield client, engine
        application.engine.dispose()
    finally:
        engine.dispose()
        forget_package("myinbox")
        assert "myinbox" not in sys.modules


def signed(message_id: str, payload: dict, secret: str) -> tuple[bytes, dict[str, str]]:
    delivery = SigningTransport(RecordingTransport(), WebhookSecrets([secret])).sign(
        Delivery(url="http://127.0.0.1/unused", json=payload), idempotency_key=message_id
    )
    return delivery.body() or b"", dict(delivery.headers)


def test_the_pages_receiver_credits_once_refuses_bad_input_and_rotates(page_app):
    client, engine = page_app
    body, headers = signed("grant-1", {"account": "acme", "amount": 5}, SECRETS[1])
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "handled"}
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "duplicate"}
    body, headers = signed("grant-2", {"account": "acme", "amount": 7}, SECRETS[0])  # the other secret of the rotation
    assert client.post("/webhooks/billing", content=body, headers=headers).json() == {"status": "handled"}
    body, headers = signed("grant-3", {"account": "acme", "amount": -1}, SECRETS[0])
    assert client.post("/webhooks/billing", content=body, headers=headers).status_code == 500
    forged_body, forged_headers = signed("grant-4", {"account": "acme", "amount": 9}, "whsec_" + "A" * 43)
    assert client.post("/webhooks/billing", content=forged_body, headers=forged_headers).status_code == 401
    with engine.connect() as connection:
        credits = connection.execute(text("SELECT account, amount FROM credits ORDER BY amount")).all()
        inbox = connection.execute(text("SELECT message_id FROM outboxkit_inbox ORDER BY message_id")).scalars().all()
    assert [tuple(credit) for credit in credits] == [("acme", 5), ("acme", 7)]
    assert inbox == ["grant-1", "grant-2"]
