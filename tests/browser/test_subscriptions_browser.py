"""The subscription pages in a real headless Chromium, without JavaScript: create (a field error first), edit,
disable with a reason and enable, rotate the secret, send a test event, count then replay past events, delete.

The app is the admin router over a kit that registers ``EventDelivery`` (tests/support/subscription_admin.py),
served by uvicorn on 127.0.0.1; endpoints are on 127.0.0.1 (allow-listed).  Without /usr/bin/chromium these
tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import publish
from tests.support.admin import (
    ServedApp,
    admin_database_url,  # noqa: F401  (fixture)
)
from tests.support.chromium import require_chromium
from tests.support.subscription_admin import SubscriptionAdminApp, subscription_admin_app


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, SubscriptionAdminApp]]:
    require_chromium()
    with subscription_admin_app(admin_database_url) as harness, ServedApp(harness.app) as base_url:
        yield base_url, harness


@pytest.fixture
def site(served) -> tuple[str, SubscriptionAdminApp]:
    served[1].clear()
    return served


def actions(harness: SubscriptionAdminApp) -> list[str]:
    with harness.engine.connect() as connection:
        return [row[0] for row in connection.execute(text("SELECT action FROM outboxkit_subscription_audit ORDER BY id"))]


def create(page, base_url: str, url: str) -> None:
    page.goto(f"{base_url}/admin/subscriptions")
    page.get_by_role("link", name="New subscription").click()
    assert page.get_by_label("Signing secret").input_value().startswith("whsec_")  # filled with a new one
    page.get_by_label("Endpoint URL").fill(url)
    page.get_by_label("Event types").fill("invoice.*\ncustomer.created")
    page.get_by_label("Tenant").fill("acme")
    page.get_by_role("button", name="Create subscription").click()


def test_create_with_a_field_error_then_edit_disable_enable_rotate_and_delete(site, page_factory):
    base_url, harness = site
    page = page_factory()
    create(page, base_url, "ftp://127.0.0.1/in")
    assert "absolute http(s) URL" in page.locator("#error-url").inner_text()
    assert page.get_by_label("Event types").input_value() == "invoice.*\ncustomer.created"  # what was typed stays
    assert harness.state()[3] == ("outboxkit_subscriptions",)

    page.get_by_label("Endpoint URL").fill("http://127.0.0.1:9/in")
    page.get_by_role("button", name="Create subscription").click()
    assert "Created" in page.get_by_role("status").inner_text()
    assert "invoice.*" in page.locator("#subscription").inner_text()

    page.locator('[data-action="edit"]').click()
    page.get_by_label("Endpoint URL").fill("http://127.0.0.1:9/moved")
    page.get_by_role("button", name="Save").click()
    assert "Saved" in page.get_by_role("status").inner_text()
    assert "/moved" in page.locator("#subscription").inner_text()

    page.get_by_label("Reason").fill("the customer asked")
    page.locator('[data-action="disable"]').click()
    assert "Disabled" in page.get_by_role("status").inner_text()
    assert "the customer asked" in page.locator("#subscription").inner_text()
    page.locator('[data-action="enable"]').click()
    assert "Enabled" in page.get_by_role("status").inner_text()

    page.locator('[data-action="rotate"]').click()
    assert page.get_by_label("New secret").input_value().startswith("whsec_")
    page.get_by_role("button", name="Rotate").click()
    assert "Rotated" in page.get_by_role("status").inner_text()
    assert "2" in page.locator("#subscription dd").nth(4).inner_text()  # two secrets while the receiver switches

    page.locator('[data-action="test-event"]').click()
    assert "test event" in page.get_by_role("status").inner_text()
    assert "pending 1" in page.locator("#deliveries").inner_text()

    page.locator('[data-action="delete"]').click()
    page.get_by_role("button", name="Delete subscription").click()
    assert "Deleted" in page.get_by_role("status").inner_text()
    assert page.locator("#no-subscriptions").is_visible()
    assert actions(harness) == ["create", "edit", "disable", "enable", "rotate", "test", "delete"]


def test_replay_counts_first_then_enqueues_exactly_what_it_counted(site, page_factory):
    base_url, harness = site
    with Session(harness.engine) as session, session.begin():
        for number in range(3):
            publish(session, "invoice.paid", {"n": number}, tenant="acme")
        publish(session, "invoice.paid", {"n": 9}, tenant="globex")
    page = page_factory()
    create(page, base_url, "http://127.0.0.1:9/late")
    page.locator('[data-action="replay"]').click()
    page.get_by_label("Since").fill((datetime.now(timezone.utc) - timedelta(hours=1)).isoformat())
    page.get_by_role("button", name="Count").click()
    assert "3 event(s) match" in page.locator("#replay-count").inner_text()
    assert actions(harness) == ["create"]  # counting changes nothing
    page.get_by_role("button", name="Replay 3 event(s)").click()
    assert "Replayed: 3 past event(s)" in page.get_by_role("status").inner_text()
    assert "pending 3" in page.locator("#deliveries").inner_text()
    assert actions(harness) == ["create", "replay"]


def limit_rows(harness: SubscriptionAdminApp) -> list[tuple[object, ...]]:
    with harness.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT per_second, cap FROM outboxkit_destination_limits ORDER BY destination"))]


def test_the_form_sets_shows_and_clears_a_subscriptions_limits_and_refuses_bad_ones(site, page_factory):
    base_url, harness = site
    page = page_factory()
    page.goto(f"{base_url}/admin/subscriptions/_new")
    page.get_by_label("Endpoint URL").fill("http://127.0.0.1:9/in")
    page.get_by_label("Event types").fill("invoice.*")
    page.get_by_label("Rate limit").fill("0")
    page.get_by_label("Max in flight").fill("1")
    page.get_by_role("button", name="Create subscription").click()
    assert "rate limit must be more than 0" in page.locator("#error-rate_limit").inner_text()
    assert page.get_by_label("Rate limit").get_attribute("aria-invalid") == "true"
    assert page.get_by_label("Max in flight").input_value() == "1"  # what was typed stays
    page.get_by_label("Rate limit").fill("2.5")
    page.get_by_label("Max in flight").fill("many")
    page.get_by_role("button", name="Create subscription").click()
    assert "max in flight must be a whole number" in page.locator("#error-max_in_flight").inner_text()
    assert harness.state()[3] == ("outboxkit_subscriptions",) and limit_rows(harness) == []  # nothing was written

    page.get_by_label("Max in flight").fill("1")
    page.get_by_role("button", name="Create subscription").click()
    assert "Created" in page.get_by_role("status").inner_text()
    shown = page.locator("#limits").inner_text()
    assert "2.5 requests per second" in shown and "at most 1 in flight" in shown
    assert limit_rows(harness) == [(2.5, 1)]

    page.locator('[data-action="edit"]').click()
    assert (page.get_by_label("Rate limit").input_value(), page.get_by_label("Max in flight").input_value()) == ("2.5", "1")
    page.get_by_label("Rate limit").fill("")
    page.get_by_label("Max in flight").fill("3")
    page.get_by_role("button", name="Save").click()
    assert "Saved" in page.get_by_role("status").inner_text()
    shown = page.locator("#limits").inner_text()
    assert "rate: the deliveries outbox's own" in shown and "at most 3 in flight" in shown
    assert limit_rows(harness) == [(None, 3)]
    assert actions(harness) == ["create", "edit"]
