"""The subscriptions' JSON API: every action audited, 422s that name the field and change nothing (the URL guard
included), 404s, the JSON-only guard, secrets never read back, and a test event that reaches the receiver signed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import EventDelivery, OutboxKitSettings, publish
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.events import secret, verified
from tests.support.subscription_admin import SubscriptionAdminApp, subscription_admin_app

UTC = timezone.utc


@pytest.fixture(scope="module")
def module_app(admin_database_url) -> Iterator[SubscriptionAdminApp]:
    with subscription_admin_app(admin_database_url) as app:
        yield app


@pytest.fixture
def api(module_app: SubscriptionAdminApp) -> SubscriptionAdminApp:
    module_app.clear()
    return module_app


def create(api: SubscriptionAdminApp, url: str, **fields) -> dict:
    answer = api.client.post("/admin/api/subscriptions/new", json={"url": url, "event_types": ["invoice.*"], **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


def audit_actions(api: SubscriptionAdminApp) -> list[tuple[str, str]]:
    with api.engine.connect() as connection:
        statement = text("SELECT action, actor FROM outboxkit_subscription_audit ORDER BY id")
        return [tuple(row) for row in connection.execute(statement)]


def test_create_generates_a_secret_shown_once_then_reads_count_it(api):
    created = create(api, "http://127.0.0.1:9/hooks", tenant="acme", headers={"X-Customer": "7"})
    assert created["secret"].startswith("whsec_") and created["subscription"]["secret_count"] == 1
    number = created["subscription"]["id"]
    listing = api.client.get("/admin/api/subscriptions", params={"tenant": "acme"}).json()
    assert [entry["id"] for entry in listing] == [number]
    assert api.client.get("/admin/api/subscriptions", params={"tenant": "globex"}).json() == []
    detail = api.client.get(f"/admin/api/subscriptions/{number}").json()
    assert "secret" not in str(detail).replace("secret_count", "")
    assert detail["deliveries"] == {"pending": 0, "done": 0, "stuck": 0}
    assert [change["action"] for change in detail["changes"]] == ["create"]
    assert audit_actions(api) == [("create", "admin")]


def test_a_refused_field_is_a_422_naming_it_and_changes_nothing(api):
    create(api, "http://127.0.0.1:9/hooks")
    before = api.state()
    refusals = {
        "url": {"url": "ftp://127.0.0.1/x", "event_types": ["invoice.paid"]},
        "event_types": {"url": "http://127.0.0.1:9/", "event_types": ["*"]},
        "secrets": {"url": "http://127.0.0.1:9/", "event_types": ["invoice.paid"], "secrets": ["not-a-secret"]},
        "headers": {"url": "http://127.0.0.1:9/", "event_types": ["invoice.paid"], "headers": {"Host": "evil"}},
    }
    for field, body in refusals.items():
        answer = api.client.post("/admin/api/subscriptions/new", json=body)
        assert answer.status_code == 422, (field, answer.text)
        assert answer.json()["detail"][0]["loc"] == ["body", field], answer.text
    assert "not-a-secret" not in api.client.post("/admin/api/subscriptions/new", json=refusals["secrets"]).text
    assert api.client.post("/admin/api/subscriptions/new", content=b"url=x",
                           headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 415
    assert api.client.post("/admin/api/subscriptions/999/enable", json={}).status_code == 404
    assert api.state() == before


def test_a_private_address_is_refused_by_the_url_guard_without_the_allow_list(admin_database_url):
    with subscription_admin_app(admin_database_url, settings=OutboxKitSettings(listen_enabled=False)) as app:
        app.clear()
        answer = app.client.post("/admin/api/subscriptions/new",
                                 json={"url": "http://127.0.0.1:9/", "event_types": ["invoice.paid"]})
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "url"]
        assert "OUTBOXKIT_URL_ALLOW_LIST" in answer.text
        assert app.state()[3] == ("outboxkit_subscriptions",)


def test_edit_disable_enable_rotate_and_delete_are_audited(api):
    number = create(api, "http://127.0.0.1:9/a", secrets=[secret(1)])["subscription"]["id"]
    base = f"/admin/api/subscriptions/{number}"
    edited = api.client.post(f"{base}/edit", json={"url": "http://127.0.0.1:9/b", "event_types": ["invoice.paid"]})
    assert edited.status_code == 200 and edited.json()["subscription"]["url"] == "http://127.0.0.1:9/b"
    assert edited.json()["subscription"]["secret_count"] == 1  # an edit keeps the secrets
    assert api.client.post(f"{base}/disable", json={"reason": ""}).status_code == 422
    disabled = api.client.post(f"{base}/disable", json={"reason": "the customer asked"}).json()["subscription"]
    assert (disabled["enabled"], disabled["disabled_reason"]) == (False, "the customer asked")
    assert api.client.post(f"{base}/enable", json={}).json()["subscription"]["enabled"] is True
    rotated = api.client.post(f"{base}/rotate-secret", json={}).json()
    assert rotated["secret"].startswith("whsec_") and rotated["subscription"]["secret_count"] == 2
    assert api.client.post(f"{base}/rotate-secret", json={"secret": secret(3), "keep_previous": False}).json()[
        "subscription"]["secret_count"] == 1
    assert api.client.post(f"{base}/rotate-secret", json={"secret": "whsec_short"}).status_code == 422
    assert api.client.post(f"{base}/delete", json={}).json() == {"subscription": None, "secret": None}
    assert api.client.get(base).status_code == 404
    assert [action for action, _ in audit_actions(api)] == [
        "create", "edit", "disable", "enable", "rotate", "rotate", "delete"]


def test_a_test_event_reaches_the_receiver_signed_with_the_rotated_secret(api, receiver):
    number = create(api, receiver.url, secrets=[secret(1)], event_types=["invoice.paid"])["subscription"]["id"]
    api.client.post(f"/admin/api/subscriptions/{number}/rotate-secret", json={"secret": secret(2), "keep_previous": False})
    sent = api.client.post(f"/admin/api/subscriptions/{number}/test-event", json={})
    assert sent.status_code == 200 and sent.json()["subscription_id"] == number
    api.kit.events.secrets.refresh_seconds = 0
    api.kit.drainer(EventDelivery).drain()
    [request] = receiver.requests
    assert request.body["type"] == "outboxkit.test" and verified(request, secret(2)) and not verified(request, secret(1))
    assert [action for action, _ in audit_actions(api)][-1] == "test"


def test_replay_counts_on_a_dry_run_then_enqueues_the_matching_events_in_order(api):
    with Session(api.engine) as session, session.begin():
        publish(session, "invoice.paid", {"n": 1}, key="k")
        publish(session, "invoice.refunded", {"n": 2}, key="k")
        publish(session, "customer.created", {"n": 3})          # not in its filters
        publish(session, "invoice.paid", {"n": 4}, tenant="acme")  # another tenant's
    number = create(api, "http://127.0.0.1:9/late", secrets=[secret(1)])["subscription"]["id"]
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    base = f"/admin/api/subscriptions/{number}/replay"
    before = api.state()
    dry = api.client.post(base, json={"since": since, "dry_run": True}).json()
    assert (dry["events"], dry["enqueued"], dry["dry_run"]) == (2, 0, True)
    assert api.state() == before
    assert api.client.post(base, json={"since": since, "event_types": ["invoice.refunded"], "dry_run": True}).json()[
        "events"] == 1
    assert api.client.post(base, json={"since": "2026-01-01T00:00:00"}).status_code == 422  # no offset
    done = api.client.post(base, json={"since": since}).json()
    assert (done["events"], done["enqueued"]) == (2, 2)
    with api.engine.connect() as connection:
        rows = connection.execute(text(
            "SELECT body->'data'->>'n', ordering_key, subscription_id FROM outboxkit_event_deliveries ORDER BY id"
        )).all()
    assert [tuple(row) for row in rows] == [("1", f"{number}:k", number), ("2", f"{number}:k", number)]
    assert [action for action, _ in audit_actions(api)] == ["create", "replay"]


def limit_rows(api: SubscriptionAdminApp) -> list[tuple[str, float | None, int | None]]:
    with api.engine.connect() as connection:
        statement = text("SELECT destination, per_second, cap FROM outboxkit_destination_limits ORDER BY destination")
        return [tuple(row) for row in connection.execute(statement)]


def test_a_subscriptions_limits_are_set_shown_and_changed_through_the_api(api):
    created = create(api, "http://127.0.0.1:9/a", rate_limit=2.5, max_in_flight=1)["subscription"]
    assert (created["rate_limit"], created["max_in_flight"]) == (2.5, 1)
    number = created["id"]
    assert limit_rows(api) == [(f"subscription {number}: http://127.0.0.1:9", 2.5, 1)]
    shown = api.client.get(f"/admin/api/subscriptions/{number}").json()["subscription"]
    assert (shown["rate_limit"], shown["max_in_flight"]) == (2.5, 1)
    listed = api.client.get("/admin/api/subscriptions").json()
    assert [(entry["rate_limit"], entry["max_in_flight"]) for entry in listed] == [(2.5, 1)]
    edited = api.client.post(f"/admin/api/subscriptions/{number}/edit",
                             json={"url": "http://127.0.0.1:9/a", "event_types": ["invoice.*"], "max_in_flight": 4})
    assert edited.status_code == 200, edited.text
    assert (edited.json()["subscription"]["rate_limit"], edited.json()["subscription"]["max_in_flight"]) == (None, 4)
    assert limit_rows(api) == [(f"subscription {number}: http://127.0.0.1:9", None, 4)]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rate_limit", 0, "rate limit must be more than 0"),
        ("rate_limit", -3, "rate limit must be more than 0"),
        ("rate_limit", 5_000_000, "at most 1,000,000 requests per second"),
        ("rate_limit", "5", "valid number"),
        ("rate_limit", True, "valid number"),
        ("max_in_flight", 0, "cap must be from 1 to 10,000 sends in flight"),
        ("max_in_flight", 20_000, "cap must be from 1 to 10,000 sends in flight"),
        ("max_in_flight", 1.5, "valid integer"),
        ("max_in_flight", "2", "valid integer"),
    ],
)
def test_a_bad_limit_is_a_422_naming_it_on_create_and_edit_and_changes_nothing(api, field, value, message):
    number = create(api, "http://127.0.0.1:9/a", max_in_flight=2)["subscription"]["id"]
    before = api.state()
    body = {"url": "http://127.0.0.1:9/b", "event_types": ["invoice.*"], field: value}
    for path in ("/admin/api/subscriptions/new", f"/admin/api/subscriptions/{number}/edit"):
        answer = api.client.post(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["detail"][0]["loc"] == ["body", field], answer.text
        assert message in answer.json()["detail"][0]["msg"], answer.text
    assert api.state() == before
