"""A destination's limits in headless Chromium: the form on its page refuses a bad value with the reason and changes
nothing, saves a rate limit and a cap (shown back in the form), clears them, each with its CSRF token and in the audit.

The served app is the example admin on a real clock (module fixtures of test_admin_browser); the test names its own
destination (its rows' host), since the module's tests share the database.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

from sqlalchemy import text

from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import add_webhooks, admin_database_url, audit_entries  # noqa: F401  (fixture)


def limits_of(engine, name: str) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT per_second, cap, updated_by FROM outboxkit_destination_limits WHERE destination = :name"),
            {"name": name})]


def test_the_limits_form_refuses_a_bad_value_then_saves_and_clears_the_limits(served, page_factory):
    base_url, harness = served
    name = f"http://partner-{uuid.uuid4().hex[:8]}.invalid:81"
    add_webhooks(harness.engine, 2, status="pending", target_url=name + "/hook")  # known by its rows
    audited_before = len(audit_entries(harness.engine))
    page = page_factory()
    destination_page = f"{base_url}/admin/outboxes/webhooks/destination?name={quote(name, safe='')}"
    page.goto(destination_page)
    form = page.locator("#destination-limits")
    assert "outbox's own: none" in form.inner_text()

    form.get_by_label("Rate limit, requests per second").fill("-2")
    form.get_by_label("Cap, sends in flight at once").fill("3")
    form.get_by_role("button", name="Save limits").click()
    assert "rate limit must be more than 0" in page.content()
    assert limits_of(harness.engine, name) == [] and len(audit_entries(harness.engine)) == audited_before

    page.goto(destination_page)
    form.get_by_label("Rate limit, requests per second").fill("4.5")
    form.get_by_label("Cap, sends in flight at once").fill("3")
    form.get_by_role("button", name="Save limits").click()
    assert "Limits saved" in page.get_by_role("status").inner_text()
    assert form.get_by_label("Rate limit, requests per second").input_value() == "4.5"
    assert form.get_by_label("Cap, sends in flight at once").input_value() == "3"
    assert "set by admin" in form.inner_text()
    assert limits_of(harness.engine, name) == [(4.5, 3, "admin")]

    form.get_by_label("Rate limit, requests per second").fill("")
    form.get_by_label("Cap, sends in flight at once").fill("")
    form.get_by_role("button", name="Save limits").click()
    assert "Limits cleared" in page.get_by_role("status").inner_text()
    assert limits_of(harness.engine, name) == []

    page.get_by_role("link", name="Audit", exact=True).click()
    audit = page.locator("table").first.inner_text()
    assert "destination_limit_clear" in audit and name in audit
    entries = audit_entries(harness.engine)[audited_before:]
    assert [(entry["action"], entry["actor"], entry["filter"]["per_second_after"], entry["filter"]["cap_after"])
            for entry in entries] == [("destination_limit", "admin", 4.5, 3), ("destination_limit_clear", "admin", None, None)]
