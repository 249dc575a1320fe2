"""Ordered keys in headless Chromium with JavaScript off: see what a stuck head blocks, and skip it.

The served app is the admin over a kit of the ordered test outbox (``OrderedEvent``,
tests/support/ordered_admin.py) on a real clock, under uvicorn on a free 127.0.0.1 port.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.admin import ServedApp, audit_entries
from tests.support.chromium import require_chromium
from tests.support.ordered_admin import add_ordered, ordered_admin_harness, ordered_status
from tests.support.receiver import Reply


@pytest.fixture(scope="module")
def served(database_factory) -> Iterator[tuple[str, object]]:
    require_chromium()
    url = database_factory.create()
    try:
        with ordered_admin_harness(url) as harness, ServedApp(harness.app) as base_url:
            yield base_url, harness
    finally:
        database_factory.drop(url)


def test_the_blocked_keys_page_shows_what_a_stuck_head_blocks_and_skip_lets_the_key_flow(served, page_factory, receiver):
    base_url, harness = served
    url = receiver.url + "/ordered"
    receiver.respond = lambda request: Reply(status=200)
    (head,) = add_ordered(harness.engine, [("account-7", 0)], target_url=url, status="stuck")
    behind = add_ordered(harness.engine, [("account-7", 1), ("account-7", 2), ("account-8", 0)], target_url=url)
    harness.kit.drain("ordered-events")
    assert ordered_status(harness.engine) == {head: "stuck", behind[0]: "pending", behind[1]: "pending", behind[2]: "done"}
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/ordered-events?status=stuck")
    assert "Delivered in order by stream" in page.locator("#ordering").inner_text()
    page.get_by_role("link", name="Blocked keys").click()
    row = page.locator(f'#blocked-keys tr[data-row-id="{head}"]')
    assert "account-7" in row.inner_text()
    assert row.locator("td.waiting").inner_text() == "2"

    row.get_by_role("link", name=str(head), exact=True).click()
    assert "head of its key: 2 row(s) wait behind it, blocked until it is reset or skipped" in (
        page.locator("#row-ordering").inner_text()
    )
    page.get_by_role("button", name="Skip it in its key's order").click()
    assert "Skipped: the row stays stuck" in page.get_by_role("status").inner_text()
    assert page.locator("#row-status").inner_text().startswith("stuck")
    assert "skipped" in page.locator("#row-ordering").inner_text()

    harness.kit.drain("ordered-events")
    assert ordered_status(harness.engine) == {head: "stuck", behind[0]: "done", behind[1]: "done", behind[2]: "done"}
    assert [(entry["action"], entry["row_ids"]) for entry in audit_entries(harness.engine)] == [("skip", [head])]
    page.goto(f"{base_url}/admin/outboxes/ordered-events/blocked-keys")
    assert page.locator("#no-blocked-keys").is_visible()


def test_the_overview_shows_the_rows_held_by_order_apart_from_the_due_ones(served, page_factory, receiver):
    base_url, harness = served
    url = receiver.url + "/ordered"
    add_ordered(harness.engine, [("account-9", 0)], target_url=url, status="stuck")
    add_ordered(harness.engine, [("account-9", 1), ("account-9", 2), ("account-9", 3)], target_url=url)
    page = page_factory()

    page.goto(f"{base_url}/admin/")
    header = page.locator("table.grid thead th", has_text="Held by order")
    assert header.is_visible()
    assert "not due until it is delivered or skipped" in (header.get_attribute("title") or "")
    row = page.locator("table.grid tbody tr", has=page.get_by_role("link", name="ordered-events", exact=True))
    assert row.locator("td.held-by-order").inner_text() == "3"
