"""Subscriptions are rows: created, edited, enabled, disabled and deleted through the store, each audited; the
endpoint passes the URL guard at save (a clear refusal, nothing written); secrets are never shown."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from outboxkit import InvalidSubscriptionError, OutboxKitSettings, UnknownSubscriptionError
from outboxkit.events import SubscriptionStore
from outboxkit.storage.tables import subscription_audit, subscriptions
from outboxkit.url_guard import UrlGuard
from tests.support.events import EventsHarness, definition, events_kit, secret  # noqa: F401  (fixture)
from tests.support.schedules import LOOPBACK_ALLOWED

ENDPOINT = "http://127.0.0.1:9/hooks"


def audit(harness: EventsHarness) -> list[tuple[str, str]]:
    statement = select(subscription_audit.c.actor, subscription_audit.c.action).order_by(subscription_audit.c.id)
    with harness.engine.connect() as connection:
        return [(row.actor, row.action) for row in connection.execute(statement)]


def test_create_edit_disable_enable_delete_are_audited_with_secrets_counted_not_copied(events_kit):
    store = events_kit.events.subscriptions
    created = store.create(definition(ENDPOINT, "invoice.*", tenant="acme", description="billing"), actor="alice")
    assert (created.event_types, created.tenant, created.enabled, created.secret_count) == (("invoice.*",), "acme", True, 1)
    edited = store.edit(created.id, definition(ENDPOINT + "/v2", "invoice.paid", "customer.*", seed=2), actor="bob")
    assert (edited.url, edited.event_types, edited.changed_by) == (ENDPOINT + "/v2", ("invoice.paid", "customer.*"), "bob")
    disabled = store.disable(created.id, reason="customer asked", actor="carol")
    assert (disabled.enabled, disabled.disabled_reason) == (False, "customer asked")
    assert store.enable(created.id, actor="dave").enabled
    store.delete(created.id, actor="erin")
    with pytest.raises(UnknownSubscriptionError, match=f"no subscription with id {created.id}"):
        store.get(created.id)
    assert audit(events_kit) == [
        ("alice", "create"), ("bob", "edit"), ("carol", "disable"), ("dave", "enable"), ("erin", "delete"),
    ]
    with events_kit.engine.connect() as connection:
        snapshots = connection.execute(select(subscription_audit.c.before, subscription_audit.c.after)).all()
    text = repr(snapshots)
    assert secret(1) not in text and secret(2) not in text
    assert snapshots[0].after["secrets"] == 1 and snapshots[1].after["event_types"] == ["invoice.paid", "customer.*"]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9/hooks", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.5/hook", "private"),
        ("http://user:hunter2@127.0.0.1:9/hooks", "may not hold a user name or password"),
    ],
)
def test_an_endpoint_the_guard_refuses_is_a_clear_error_and_nothing_is_written(engine, url, reason):
    store = SubscriptionStore(engine)  # no allow-list: only public addresses
    with pytest.raises(InvalidSubscriptionError, match=f"^url: .*{reason}") as refused:
        store.create(definition(url, "invoice.paid"), actor="mallory")
    assert refused.value.field == "url"
    assert "hunter2" not in str(refused.value)
    with engine.connect() as connection:
        assert connection.execute(select(subscriptions)).all() == []
        assert connection.execute(select(subscription_audit)).all() == []


def test_the_kits_store_takes_the_allow_list_from_the_settings(engine, clock):
    allowed = SubscriptionStore(engine, url_guard=UrlGuard.from_entries(LOOPBACK_ALLOWED), clock=clock)
    assert allowed.create(definition(ENDPOINT, "invoice.paid"), actor="alice").id > 0
    assert OutboxKitSettings(url_allow_list=LOOPBACK_ALLOWED).allow_list == allowed.url_guard.allow


def test_an_edit_to_a_refused_endpoint_changes_nothing(events_kit, engine):
    created = events_kit.events.subscriptions.create(definition(ENDPOINT, "invoice.paid"), actor="alice")
    with pytest.raises(InvalidSubscriptionError, match="^url: .*private"):
        events_kit.events.subscriptions.edit(created.id, definition("http://192.168.1.1/", "invoice.paid"), actor="bob")
    assert events_kit.events.subscriptions.get(created.id).url == ENDPOINT
    assert audit(events_kit) == [("alice", "create")]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Authorization": "Bearer abc"}, "may not hold a credential in clear"),
        ({"Cookie": "session=1"}, "may not hold a credential in clear"),
        ({"Authorization": "secret:missing_token"}, "which the settings do not hold"),
    ],
)
def test_literal_credentials_in_headers_are_refused_and_nothing_is_written(events_kit, headers, message):
    with pytest.raises(InvalidSubscriptionError, match=message) as refused:
        events_kit.events.subscriptions.create(definition(ENDPOINT, "invoice.paid", headers=headers), actor="mallory")
    assert refused.value.field == "headers"
    assert events_kit.counts()["subscriptions"] == 0


def test_a_header_referencing_a_setting_is_stored_as_the_reference(engine, clock):
    store = SubscriptionStore(
        engine, url_guard=UrlGuard.from_entries(LOOPBACK_ALLOWED), secret_names={"partner_token"}, clock=clock
    )
    created = store.create(definition(ENDPOINT, "invoice.paid", headers={"Authorization": "secret:partner_token"}), actor="a")
    assert created.headers == {"Authorization": "secret:partner_token"}


def test_a_disable_needs_a_reason_and_an_unknown_id_is_named(events_kit):
    created = events_kit.events.subscriptions.create(definition(ENDPOINT, "invoice.paid"), actor="alice")
    with pytest.raises(InvalidSubscriptionError, match="say why"):
        events_kit.events.subscriptions.disable(created.id, reason=" ", actor="bob")
    with pytest.raises(UnknownSubscriptionError, match="no subscription with id 999"):
        events_kit.events.subscriptions.disable(999, reason="gone", actor="bob")
    assert audit(events_kit) == [("alice", "create")]


def test_list_by_tenant(events_kit):
    store = events_kit.events.subscriptions
    store.create(definition(ENDPOINT, "invoice.paid", tenant="acme"), actor="a")
    store.create(definition(ENDPOINT, "invoice.paid", tenant="globex"), actor="a")
    assert [found.tenant for found in store.list(tenant="acme")] == ["acme"]
    assert len(store.list()) == 2
