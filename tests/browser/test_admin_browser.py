"""The admin in a real headless Chromium: find a stuck row, reset it, watch it deliver.

The example admin app runs under uvicorn in a thread on a free 127.0.0.1
port; the browser signs in with HTTP Basic.  The main flows run with
JavaScript disabled, which proves the pages need none.  Without
/usr/bin/chromium these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.admin import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    ServedApp,
    add_webhooks,
    admin_database_url,  # noqa: F401  (fixture)
    admin_harness,
    empty_tables,
    row_of,
)
from tests.support.receiver import Reply

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _require_chromium() -> None:
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is not installed (pip install -e '.[dev]')"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run under CI: {missing}")
        pytest.skip(f"browser tests need a browser: {missing}")


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, object]]:
    _require_chromium()
    empty_tables(admin_database_url)
    with admin_harness(admin_database_url) as harness, ServedApp(harness.app) as base_url:
        yield base_url, harness


@pytest.fixture(scope="module")
def browser(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page_factory(browser):
    contexts = []

    def open_page(*, javascript: bool = False):
        context = browser.new_context(
            http_credentials={"username": ADMIN_USER, "password": ADMIN_PASSWORD}, java_script_enabled=javascript
        )
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def test_reset_a_stuck_row_and_watch_it_deliver(served, page_factory, receiver):
    base_url, harness = served
    receiver.respond = lambda request: Reply(status=400, body=b"amount must be positive")
    (row_id,) = add_webhooks(harness.engine, 1, status="pending", error=None, status_code=None, attempts=0,
                             target_url=receiver.url + "/hook", payload={"amount": -5})
    assert harness.kit.drain_once("webhooks").stuck == 1
    page = page_factory()

    page.goto(f"{base_url}/admin/")
    page.get_by_role("link", name="webhooks").first.wait_for()
    page.locator('a[href="/admin/outboxes/webhooks?status=stuck"]').click()
    page.get_by_role("link", name=str(row_id), exact=True).click()
    assert page.locator("#row-status").inner_text().startswith("stuck")
    assert "400" in page.locator("dl.facts").first.inner_text()

    page.get_by_role("button", name="Reset this row").click()
    page.get_by_role("status").wait_for()
    assert "Reset: the row is pending" in page.get_by_role("status").inner_text()
    assert page.locator("#row-status").inner_text().startswith("pending")

    receiver.respond = lambda request: Reply(status=200)
    assert harness.kit.drain_once("webhooks").delivered == 1
    page.reload()
    assert page.locator("#row-status").inner_text().startswith("done")
    assert row_of(harness.engine, row_id)["status"] == "done"


def test_bulk_reset_shows_the_dry_run_count_before_resetting(served, page_factory):
    base_url, harness = served
    matching = add_webhooks(harness.engine, 3, status="stuck", error="HTTP 422: bad amount")
    other = add_webhooks(harness.engine, 2, status="stuck", error="HTTP 404: no such workspace")
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
    page.get_by_label("Error contains").fill("bad amount")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name="Reset all matching…").click()
    assert re.search(r"\b3 stuck row\(s\) match now", page.locator("#dry-run-count").inner_text())
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"stuck"}

    page.get_by_role("button", name="Reset 3 row(s)").click()
    assert "Reset 3 row(s)" in page.get_by_role("status").inner_text()
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"pending"}
    assert {row_of(harness.engine, row_id)["status"] for row_id in other} == {"stuck"}


def test_a_form_posted_without_its_csrf_token_is_refused(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck")
    page = page_factory(javascript=True)

    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")
    page.evaluate("document.querySelectorAll('input[name=csrf_token]').forEach((field) => field.remove())")
    page.get_by_role("button", name="Reset this row").click()

    assert "security token is missing, invalid or expired" in page.get_by_role("alert").inner_text()
    assert row_of(harness.engine, row_id)["status"] == "stuck"
