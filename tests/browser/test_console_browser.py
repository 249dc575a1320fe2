"""The console in headless Chromium: attempt history, jobs, search, lists, bulk actions, pause, charts, timezones, phones.

The flows run with JavaScript disabled unless the feature is the vendored
script's (local times, select all); the served app is the example admin on
a real clock.  Without /usr/bin/chromium these tests skip (fail under CI=true).
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import add_webhooks, admin_database_url, row_of  # noqa: F401  (fixture)
from tests.support.receiver import Reply


def marker() -> str:
    return f"mark-{uuid.uuid4().hex[:8]}"


def test_the_row_page_lists_every_attempt_and_keeps_the_stuck_reason_after_a_reset(served, page_factory, receiver):
    base_url, harness = served
    receiver.respond = lambda request: Reply(status=422, body=b"amount must be positive")
    (row_id,) = add_webhooks(
        harness.engine, 1, status="pending", error=None, status_code=None, attempts=0, target_url=receiver.url + "/hook"
    )
    harness.kit.drain_once("webhooks")
    page = page_factory()
    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")
    page.get_by_role("button", name="Reset this row").click()
    page.get_by_role("status").wait_for()
    receiver.respond = lambda request: Reply(status=200)
    harness.kit.drain_once("webhooks")
    page.reload()

    rows = page.locator("#attempt-history > tbody > tr.attempt")  # each attempt, the reset's marker between them
    assert rows.count() == 2
    assert "done" in rows.nth(0).inner_text() and "200" in rows.nth(0).inner_text()
    assert "stuck" in rows.nth(1).inner_text() and "422" in rows.nth(1).inner_text()
    assert page.locator("#attempt-history > tbody > tr.reset-marker").count() == 1
    assert page.locator("#row-status").inner_text().startswith("done")


def test_the_schedules_page_shows_internal_jobs_in_words_and_a_jobs_run_history(served, page_factory):
    base_url, harness = served
    page = page_factory()
    page.goto(f"{base_url}/admin/schedules")
    row = page.locator('tr[data-internal-job="outboxkit.drain.webhooks"]')
    assert "every minute (UTC)" in row.inner_text()
    row.get_by_role("link", name="webhooks").click()
    assert page.get_by_role("heading", level=1).inner_text() == "Internal job outboxkit.drain.webhooks"
    assert "Schedule" in page.locator("dl.facts").inner_text()


def test_pause_and_resume_from_the_outbox_page_and_the_pause_shown_with_the_internal_jobs(served, page_factory):
    base_url, harness = served
    page = page_factory()
    try:
        page.goto(f"{base_url}/admin/outboxes/webhooks")
        page.locator('button[data-action="pause"]').click()
        assert page.get_by_role("heading", level=1).inner_text() == "Pause the drains of webhooks?"  # asks first
        page.get_by_role("button", name="Pause drains").click()
        assert "Paused" in page.get_by_role("status").inner_text()
        assert page.locator("#paused").is_visible()
        assert harness.kit.drain_once("webhooks").claimed == 0
        page.goto(f"{base_url}/admin/schedules")
        assert "drains paused" in page.locator('tr[data-internal-job="outboxkit.drain.webhooks"]').inner_text()

        page.goto(f"{base_url}/admin/outboxes/webhooks")
        page.get_by_role("button", name="Resume drains").click()
        assert "Resumed" in page.get_by_role("status").inner_text()
        page.get_by_role("button", name="Drain now").click()
        assert "Woke every drain" in page.get_by_role("status").inner_text()
    finally:  # the other tests of this module share the app: leave it unpaused
        with harness.engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM outboxkit_outbox_pauses")
        harness.kit.drainer("webhooks").pause_check.forget()


def test_find_a_row_by_id_or_key_from_the_search_box(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck")
    key = str(row_of(harness.engine, row_id)["idempotency_key"])
    page = page_factory()
    for query in (str(row_id), key):
        page.goto(f"{base_url}/admin/schedules")
        page.get_by_role("searchbox").fill(query)
        page.get_by_role("button", name="Find").click()
        assert page.url.endswith(f"/admin/outboxes/webhooks/rows/{row_id}")
    page.get_by_role("searchbox").fill("not-an-id")
    page.get_by_role("button", name="Find").click()
    assert "row id" in page.get_by_role("alert").inner_text()


def test_filter_page_size_tabs_and_both_way_paging_keep_the_filter(served, page_factory):
    base_url, harness = served
    mark = marker()
    add_webhooks(harness.engine, 25, status="stuck", error=f"{mark} receiver answered 400")
    add_webhooks(harness.engine, 3, status="pending", error=f"{mark} timeout")
    page = page_factory()
    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
    page.get_by_label("Error contains").fill(mark)
    page.get_by_label("Rows per page").select_option("20")
    page.get_by_role("button", name="Filter").click()

    assert page.locator('input[name="ids"]').count() == 20
    assert re.search(r"stuck\s+25", page.locator("nav.tabs").inner_text())
    assert re.search(r"pending\s+3", page.locator("nav.tabs").inner_text())
    page.get_by_role("link", name="Next page →").click()
    assert page.locator('input[name="ids"]').count() == 5
    page.get_by_role("link", name="← Previous page").click()
    assert page.locator('input[name="ids"]').count() == 20
    page.locator("nav.tabs").get_by_role("link", name=re.compile("^pending")).click()
    assert page.get_by_label("Error contains").input_value() == mark  # the filter followed the tab
    assert page.locator("table.rows tbody tr").count() == 3


def test_select_all_with_the_vendored_script_then_reset_selected(served, page_factory):
    base_url, harness = served
    mark = marker()
    ids = add_webhooks(harness.engine, 4, status="stuck", error=mark)
    page = page_factory(javascript=True)
    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck&error_contains={mark}")
    page.get_by_label("select every row on this page").check()
    assert page.locator('input[name="ids"]:checked').count() == 4
    page.get_by_role("button", name="Reset selected").click()
    assert "Reset 4 row(s)" in page.get_by_role("status").inner_text()
    assert {row_of(harness.engine, row_id)["status"] for row_id in ids} == {"pending"}


def test_retry_all_on_the_page_without_javascript(served, page_factory):
    base_url, harness = served
    mark = marker()
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    ids = add_webhooks(harness.engine, 3, status="pending", error=mark, next_attempt_at=later)
    page = page_factory()
    page.goto(f"{base_url}/admin/outboxes/webhooks?status=pending&error_contains={mark}")
    page.get_by_role("button", name="Retry all 3 on this page now").click()
    assert "3 row(s) are due now" in page.get_by_role("status").inner_text()
    assert all(row_of(harness.engine, row_id)["next_attempt_at"] < later for row_id in ids)


def test_times_in_utc_without_script_and_in_the_viewers_timezone_with_it(served, browser):
    base_url, harness = served
    add_webhooks(harness.engine, 1, status="stuck")
    credentials = {"username": "admin", "password": "correct horse battery staple"}
    for javascript in (False, True):
        context = browser.new_context(http_credentials=credentials, java_script_enabled=javascript, timezone_id="Asia/Tokyo")
        try:
            page = context.new_page()
            page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
            first = page.locator("span.when").first
            assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", first.inner_text())
            if javascript:
                first.locator(".local").wait_for()
                assert first.locator(".local").inner_text().endswith("Asia/Tokyo")
            else:
                assert first.locator(".local").count() == 0
        finally:
            context.close()


def test_the_overview_draws_its_charts_without_script_and_auto_refresh_can_be_switched(served, page_factory):
    base_url, harness = served
    page = page_factory()
    page.goto(f"{base_url}/admin/")
    assert page.locator("svg.chart").count() == 8
    assert page.locator("#charts-webhooks figcaption").count() == 4
    page.get_by_role("link", name="Auto-refresh every 15 s").click()
    assert page.locator('meta[http-equiv="refresh"]').count() == 1
    page.get_by_role("link", name="Stop auto-refresh").click()
    assert page.locator('meta[http-equiv="refresh"]').count() == 0


def test_the_script_and_icon_load_under_the_csp_with_no_violation(served, page_factory):
    base_url, harness = served
    page = page_factory(javascript=True)
    violations = []
    page.on("console", lambda message: violations.append(message.text) if "Content Security Policy" in message.text else None)
    page.goto(f"{base_url}/admin/")
    page.wait_for_load_state("load")
    icon = page.request.get(f"{base_url}/admin/static/favicon.svg")
    assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert page.evaluate("() => document.querySelector('link[rel=icon]').href").endswith("/admin/static/favicon.svg")
    assert violations == []


def test_a_phone_sees_whole_words_and_scrolls_wide_tables_in_their_box(served, browser):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck", error="receiver answered 400: the amount must be positive " * 3)
    context = browser.new_context(
        http_credentials={"username": "admin", "password": "correct horse battery staple"},
        viewport={"width": 375, "height": 740},
        is_mobile=True,
        java_script_enabled=False,
    )
    try:
        page = context.new_page()
        for path in (
            "/admin/outboxes/webhooks?status=stuck",
            f"/admin/outboxes/webhooks/rows/{row_id}",
            "/admin/",
            "/admin/schedules",
        ):
            page.goto(base_url + path)
            assert page.evaluate("() => document.documentElement.scrollWidth") <= 375 + 1, (
                path
            )  # the page itself does not scroll sideways
            narrowest = page.evaluate(
                "() => Math.min(...[...document.querySelectorAll('td, dd, th')].filter(e => e.innerText.trim().length > 3)"
                ".map(e => e.getBoundingClientRect().width))"
            )
            assert narrowest >= 30, f"{path}: a cell is squeezed to {narrowest}px"
        page.goto(base_url + "/admin/outboxes/webhooks?status=stuck")
        assert page.locator("td.error-text").first.bounding_box()["width"] >= 150
    finally:
        context.close()
