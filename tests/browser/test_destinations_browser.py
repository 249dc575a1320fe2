"""Destinations in headless Chromium: the list, a destination's page, its rows waiting, and resume, disable (after its
confirmation page) and probe now, each with its CSRF token and visible in the audit; a forged token changes nothing.

The served app is the example admin on a real clock (module fixtures of test_admin_browser); each test names its own
destination (its rows' host), since the module's tests share the database.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from urllib.parse import quote

from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import add_webhooks, admin_database_url, audit_entries, row_of  # noqa: F401  (fixture)
from tests.support.destinations import destination_row, open_breaker


def a_dead_destination(harness, rows: int) -> tuple[str, list[int], datetime]:
    """A destination of its own, its breaker open now, with ``rows`` rows it holds back (until its probe, returned)."""
    name = f"http://dead-{uuid.uuid4().hex[:8]}.invalid:81"
    state = open_breaker(harness.engine, at=datetime.now(timezone.utc), destination=name)
    ids = add_webhooks(harness.engine, rows, status="pending", target_url=name + "/hook")
    return name, ids, state.next_probe_at


def test_from_the_list_to_a_destination_its_rows_waiting_then_disable_and_resume_it(served, page_factory):
    base_url, harness = served
    name, held, _ = a_dead_destination(harness, 2)
    audited_before = len(audit_entries(harness.engine))
    page = page_factory()

    page.goto(f"{base_url}/admin/")
    page.get_by_role("link", name="Destinations", exact=True).click()
    row = page.locator(f'tr[data-destination="{name}"]')
    assert "open" in row.inner_text() and "503" in row.inner_text() and "100%" in row.inner_text()
    row.get_by_role("link", name=name).click()
    assert "open" in page.locator("#destination").inner_text()

    assert page.locator("#waiting-rows").inner_text().startswith("2")  # the rows the claim leaves out

    page.get_by_role("button", name="Disable…").click()
    assert "Disable" in page.get_by_role("heading", level=1).inner_text() and "2 row(s) waiting" in page.content()
    assert destination_row(harness.engine, name)["status"] == "open"  # asking changed nothing
    page.get_by_role("button", name="Disable destination").click()
    assert "Disabled: nothing is sent" in page.get_by_role("status").inner_text()
    assert "disabled" in page.locator("#destination").inner_text()
    assert destination_row(harness.engine, name)["status"] == "disabled"

    page.get_by_role("button", name="Resume").click()
    assert "2 row(s) it held back may go now" in page.get_by_role("status").inner_text()
    assert destination_row(harness.engine, name)["status"] == "healthy"
    assert len(held) == 2

    page.get_by_role("link", name="Audit", exact=True).click()
    audit = page.locator("table").first.inner_text()
    assert "destination_disable" in audit and "destination_resume" in audit and name in audit
    entries = audit_entries(harness.engine)[audited_before:]
    assert [(entry["action"], entry["actor"], entry["filter"]["destination"]) for entry in entries] == [
        ("destination_disable", "admin", name), ("destination_resume", "admin", name)]


def test_probe_now_ends_the_cool_down_and_a_forged_token_changes_nothing(served, page_factory):
    base_url, harness = served
    name, (row_id,), probe_at = a_dead_destination(harness, 1)
    audited_before = len(audit_entries(harness.engine))
    page = page_factory(javascript=True)
    page.goto(f"{base_url}/admin/outboxes/webhooks/destination?name={quote(name, safe='')}")

    page.evaluate("document.querySelectorAll('input[name=csrf_token]').forEach(input => input.value = 'forged')")
    page.get_by_role("button", name="Probe now").click()
    assert "security token is missing, invalid or expired" in page.content()
    assert destination_row(harness.engine, name)["next_probe_at"] == probe_at  # unchanged
    assert len(audit_entries(harness.engine)) == audited_before

    page.goto(f"{base_url}/admin/outboxes/webhooks/destination?name={quote(name, safe='')}")
    page.get_by_role("button", name="Probe now").click()
    assert "The cool-down ends now" in page.get_by_role("status").inner_text()
    after = destination_row(harness.engine, name)
    assert after["next_probe_at"] <= datetime.now(timezone.utc)
    assert row_of(harness.engine, row_id)["status"] in ("pending", "done")  # it may go as the probe
    (entry,) = audit_entries(harness.engine)[audited_before:]
    assert (entry["action"], entry["actor"], entry["filter"]["destination"]) == ("destination_probe", "admin", name)
    page.goto(f"{base_url}/admin/audit")
    assert "destination_probe" in page.locator("table").first.inner_text()


def test_the_overview_puts_destinations_holding_rows_first_and_counts_what_they_hold(served, page_factory):
    base_url, harness = served
    name, held, _ = a_dead_destination(harness, 3)
    page = page_factory()

    page.goto(f"{base_url}/admin/")

    section = page.locator("#held-back")
    row = section.locator("tr", has=page.get_by_role("link", name=name))
    assert "open" in row.inner_text() and "webhooks" in row.inner_text()
    assert row.locator("td.num").inner_text() == "3"
    # The section comes before the outboxes' table, and the table counts the rows held in their own column.
    assert page.evaluate(
        "() => { const held = document.getElementById('held-back');"
        " const outboxes = [...document.querySelectorAll('table.grid')].find(table => !held.contains(table));"
        " return Boolean(held.compareDocumentPosition(outboxes) & Node.DOCUMENT_POSITION_FOLLOWING); }"
    )
    webhooks = page.locator("table.grid").nth(1).locator("tr", has=page.get_by_role("link", name="webhooks", exact=True))
    assert int(webhooks.locator("td.held-by-destination").inner_text()) >= 3
    assert "held by destinations" in page.locator("#charts-webhooks figcaption").first.inner_text()
    row.get_by_role("link", name=name).click()
    assert page.locator("#waiting-rows").inner_text().startswith("3")
    assert len(held) == 3
