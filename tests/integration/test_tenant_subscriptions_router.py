"""The tenant-scoped subscriptions router: each tenant sees and changes only its own subscriptions and deliveries;
another tenant's rows answer 404 exactly like missing ones and are left unchanged by every route."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from outboxkit import EventDelivery, OutboxKit, OutboxKitSettings, publish
from outboxkit.admin.tenant_subscriptions import create_tenant_router
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.database import sqlalchemy_url
from tests.support.events import secret
from tests.support.schedules import LOOPBACK_ALLOWED
from tests.support.subscription_admin import SUBSCRIPTION_TABLES


def current_tenant(x_tenant: str = Header(default="")) -> str:
    """The test's authentication: the tenant named by a header (none: 401)."""
    if x_tenant == "nobody":
        raise HTTPException(401, "sign in")
    return x_tenant


class Tenants:
    def __init__(self, client: TestClient, engine) -> None:
        self.client, self.engine = client, engine

    def as_(self, tenant: str):
        return lambda method, path, **kwargs: self.client.request(method, path, headers={"X-Tenant": tenant}, **kwargs)

    def state(self) -> list[tuple[object, ...]]:
        with self.engine.connect() as connection:
            return [(table, *[tuple(row) for row in connection.execute(text(f"SELECT * FROM {table} ORDER BY 1"))])
                    for table in SUBSCRIPTION_TABLES]


@pytest.fixture(scope="module")
def tenants(admin_database_url) -> Iterator[Tenants]:
    engine = create_engine(sqlalchemy_url(admin_database_url), pool_size=2, max_overflow=0)
    settings = OutboxKitSettings(listen_enabled=False, url_allow_list=LOOPBACK_ALLOWED)
    kit = OutboxKit(engine, [EventDelivery], settings=settings)
    app = FastAPI()
    app.include_router(create_tenant_router(kit, tenant=current_tenant), prefix="/webhooks")
    try:
        with TestClient(app) as client:
            yield Tenants(client, engine)
    finally:
        kit.close()
        engine.dispose()


@pytest.fixture
def site(tenants: Tenants) -> Tenants:
    with tenants.engine.begin() as connection:
        for table in SUBSCRIPTION_TABLES:
            connection.execute(text(f"DELETE FROM {table}"))
    return tenants


def test_a_tenant_creates_lists_and_changes_only_its_own(site):
    acme, globex = site.as_("acme"), site.as_("globex")
    created = acme("POST", "/webhooks/subscriptions", json={"url": "http://127.0.0.1:9/a", "event_types": ["invoice.*"]})
    assert created.status_code == 200, created.text
    mine = created.json()["subscription"]
    assert mine["tenant"] == "acme" and created.json()["secret"].startswith("whsec_")
    assert [entry["id"] for entry in acme("GET", "/webhooks/subscriptions").json()] == [mine["id"]]
    assert globex("GET", "/webhooks/subscriptions").json() == []
    refused = globex("POST", "/webhooks/subscriptions",
                     json={"url": "http://127.0.0.1:9/g", "event_types": ["invoice.*"], "tenant": "acme"})
    assert refused.status_code == 422  # the tenant is the authentication's, never the body's
    disabled = acme("POST", f"/webhooks/subscriptions/{mine['id']}/disable", json={"reason": "maintenance"})
    assert disabled.status_code == 200 and disabled.json()["subscription"]["enabled"] is False
    assert site.client.get("/webhooks/subscriptions", headers={"X-Tenant": "nobody"}).status_code == 401
    assert site.client.get("/webhooks/subscriptions").status_code == 403  # an empty tenant is never "every one"


def test_another_tenants_subscription_is_404_on_every_route_and_nothing_changes(site):
    acme, globex = site.as_("acme"), site.as_("globex")
    number = acme("POST", "/webhooks/subscriptions",
                  json={"url": "http://127.0.0.1:9/a", "event_types": ["invoice.*"], "secrets": [secret(1)]}
                  ).json()["subscription"]["id"]
    with Session(site.engine) as session, session.begin():
        event_id = publish(session, "invoice.paid", {"n": 1}, tenant="acme").event_id
    before = site.state()
    base = f"/webhooks/subscriptions/{number}"
    attempts = [
        ("GET", base, None), ("GET", f"{base}/deliveries", None),
        ("POST", f"{base}/edit", {"url": "http://127.0.0.1:9/stolen", "event_types": ["invoice.*"]}),
        ("POST", f"{base}/disable", {"reason": "x"}), ("POST", f"{base}/enable", {}), ("POST", f"{base}/delete", {}),
        ("POST", f"{base}/rotate-secret", {"secret": secret(2)}), ("POST", f"{base}/test-event", {}),
        ("POST", f"{base}/deliveries/{event_id}/resend", {}),
    ]
    for method, path, body in attempts:
        answer = globex(method, path, json=body) if body is not None else globex(method, path)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json() == {"detail": f"no subscription with id {number}"}  # as a missing one says
        missing = globex(method, path.replace(str(number), "999999"), **({"json": body} if body is not None else {}))
        assert missing.status_code == 404
    assert site.state() == before


def test_a_tenant_reads_its_deliveries_and_resends_one(site):
    acme = site.as_("acme")
    number = acme("POST", "/webhooks/subscriptions",
                  json={"url": "http://127.0.0.1:9/a", "event_types": ["invoice.*"]}).json()["subscription"]["id"]
    with Session(site.engine) as session, session.begin():
        event_id = publish(session, "invoice.paid", {"n": 1}, tenant="acme").event_id
        other_event = publish(session, "invoice.paid", {"n": 2}, tenant="globex").event_id
    [delivery] = acme("GET", f"/webhooks/subscriptions/{number}/deliveries").json()
    assert (delivery["event_id"], delivery["status"]) == (event_id, "pending")
    assert acme("POST", f"/webhooks/subscriptions/{number}/deliveries/{event_id}/resend", json={}).status_code == 200
    # An event this subscription was never sent (another tenant's) cannot be pulled in by a resend.
    assert acme("POST", f"/webhooks/subscriptions/{number}/deliveries/{other_event}/resend", json={}).status_code == 404
    assert len(acme("GET", f"/webhooks/subscriptions/{number}/deliveries").json()) == 2


def test_a_tenant_throttles_its_own_endpoint_and_a_bad_limit_is_a_422_that_changes_nothing(site):
    acme = site.as_("acme")
    body = {"url": "http://127.0.0.1:9/a", "event_types": ["invoice.*"], "rate_limit": 10, "max_in_flight": 2}
    created = acme("POST", "/webhooks/subscriptions", json=body)
    assert created.status_code == 200, created.text
    mine = created.json()["subscription"]
    assert (mine["rate_limit"], mine["max_in_flight"]) == (10.0, 2)
    edited = acme("POST", f"/webhooks/subscriptions/{mine['id']}/edit", json={**body, "rate_limit": 1})
    assert edited.status_code == 200 and edited.json()["subscription"]["rate_limit"] == 1.0
    assert acme("GET", f"/webhooks/subscriptions/{mine['id']}").json()["max_in_flight"] == 2
    before = site.state()
    for path in ("/webhooks/subscriptions", f"/webhooks/subscriptions/{mine['id']}/edit"):
        refused = acme("POST", path, json={**body, "max_in_flight": 0})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "max_in_flight"], refused.text
        assert "cap must be from 1 to 10,000" in refused.text
    assert site.state() == before
