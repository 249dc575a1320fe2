"""docs/events.md's complete example runs: a customer adds an endpoint, paying an invoice publishes in the same
transaction, and the customer's receiver gets the event signed with its secret; a private endpoint is refused."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit import EventDelivery
from tests.support.database import libpq_url, sqlalchemy_url
from tests.support.doc_pages import create_schema, forget_package, page_files, write_package
from tests.support.events import secret, verified
from tests.support.schedules import LOOPBACK_ALLOWED


@pytest.fixture
def saas(tmp_path, monkeypatch, database_factory, receiver) -> Iterator[object]:
    url = database_factory.create_empty()
    write_package(tmp_path, page_files("events.md"), receiver_url=receiver.url)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", libpq_url(url))
    monkeypatch.setenv("OUTBOXKIT_URL_ALLOW_LIST", ",".join(LOOPBACK_ALLOWED))
    monkeypatch.setenv("OUTBOXKIT_LISTEN_ENABLED", "false")
    models = importlib.import_module("saas.models")
    engine = create_engine(sqlalchemy_url(url))
    create_schema(engine, models.Base.metadata, [EventDelivery])
    with Session(engine) as session, session.begin():
        session.add(models.Invoice(id=7, customer="acme", amount=1200))
    app_module = importlib.import_module("saas.app")
    yield app_module
    app_module.kit.close()
    app_module.engine.dispose()
    engine.dispose()
    forget_package("saas")
    database_factory.drop(url)


def test_a_customer_endpoint_receives_the_paid_invoice_signed(saas, receiver):
    client = TestClient(saas.app)
    added = client.post("/customers/acme/webhook-endpoints",
                        json={"url": receiver.url + "/hooks", "event_types": ["invoice.*"], "secret": secret(9)})
    assert added.status_code == 201
    other = client.post("/customers/globex/webhook-endpoints",
                        json={"url": receiver.url + "/globex", "event_types": ["invoice.*"], "secret": secret(8)})
    assert other.status_code == 201
    refused = client.post("/customers/acme/webhook-endpoints",
                          json={"url": "http://10.0.0.8/hooks", "event_types": ["invoice.paid"], "secret": secret(9)})
    assert refused.status_code == 422 and refused.json()["detail"]["field"] == "url"
    assert client.post("/invoices/7/pay").json()["deliveries"] == 1
    saas.kit.drainer(EventDelivery).drain()
    [request] = receiver.requests
    assert request.path == "/hooks" and verified(request, secret(9))
    assert request.body["type"] == "invoice.paid" and request.body["data"] == {"invoice": 7, "amount": 1200}
