"""The console as operators compare it (issue 19, section 4), in headless Chromium.

Dark mode from the system setting, charts with axes and a 1 h / 24 h / 7 d
window, compact lists, live refresh under the CSP, formatted job counts, a
leader line that keeps the layout, and "Drain now" on a paused outbox.
Without /usr/bin/chromium these tests skip (fail under CI=true).
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
from sqlalchemy import text

from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER, add_webhooks, admin_database_url, record_run  # noqa: F401

CREDENTIALS = {"username": ADMIN_USER, "password": ADMIN_PASSWORD}


def luminance(css_color: str) -> float:
    """0 (black) to 1 (white), from ``rgb(r, g, b)``."""
    red, green, blue = (int(part) for part in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * red + 0.7152 * green + 0.0722 * blue) / 255


def test_dark_mode_follows_the_system_setting_with_the_vendored_stylesheet_only(served, browser):
    base_url, harness = served
    add_webhooks(harness.engine, 2, status="stuck")
    colours = {}
    requested: list[str] = []
    for scheme in ("light", "dark"):
        context = browser.new_context(http_credentials=CREDENTIALS, color_scheme=scheme, java_script_enabled=False)
        try:
            page = context.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
            colours[scheme] = page.evaluate(
                "() => [getComputedStyle(document.body).backgroundColor, getComputedStyle(document.body).color,"
                " getComputedStyle(document.querySelector('table.grid')).backgroundColor]"
            )
            assert all(url.startswith(base_url) for url in requested), requested  # nothing from a CDN
        finally:
            context.close()
    light_background, light_ink, light_table = (luminance(colour) for colour in colours["light"])
    dark_background, dark_ink, dark_table = (luminance(colour) for colour in colours["dark"])
    assert light_background > 0.9 and light_ink < 0.3 and light_table > 0.9
    assert dark_background < 0.15 and dark_ink > 0.8 and dark_table < 0.15


def ticks_of(chart) -> list[str]:
    return chart.locator("text.tick").evaluate_all("nodes => nodes.map(node => node.textContent)")


def test_charts_have_axes_values_and_a_window_of_an_hour_a_day_or_a_week(served, page_factory):
    base_url, harness = served
    three_hours_ago = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(second=0, microsecond=0)
    with harness.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outboxkit_outbox_minutes (outbox, minute, delivered, failed, stuck) "
                "VALUES ('credit-grants', :minute, 42, 0, 0)"
            ),
            {"minute": three_hours_ago},
        )
    page = page_factory()
    page.goto(f"{base_url}/admin/")
    delivered = page.locator("#charts-credit-grants svg.chart-delivered")
    assert ticks_of(delivered)[:4] == ["—", "0", "−1 h", "now"]
    assert "Delivered: 0 in 1 h" in page.locator("#charts-credit-grants").inner_text()

    page.get_by_role("link", name="24 h").click()
    assert "window=24h" in page.url and page.get_by_role("heading", name="Last 24 h").is_visible()
    assert "Delivered: 42 in 24 h" in page.locator("#charts-credit-grants").inner_text()
    ticks = ticks_of(delivered)
    assert ticks[:4] == ["42", "0", "−24 h", "now"] and ticks[4].endswith("UTC")  # the value scale and the time scale
    bar = delivered.locator("rect").first
    assert bar.locator("title").text_content().endswith(": 42")  # each bar says its time and value
    assert delivered.locator("rect").count() == 1

    page.get_by_role("link", name="7 d").click()
    assert page.get_by_role("heading", name="Last 7 d").is_visible()
    assert "−7 d" in page.locator("#charts-credit-grants svg.chart-delivered").inner_html()
    page.goto(f"{base_url}/admin/?window=1y")
    assert "window must be one of 1h, 24h, 7d" in page.get_by_role("alert").inner_text()


def test_a_desktop_screen_shows_more_than_eight_list_rows(served, browser):
    base_url, harness = served
    mark = f"mark-{uuid.uuid4().hex[:8]}"
    add_webhooks(harness.engine, 30, status="stuck", error=f"{mark} receiver answered 400: the amount must be positive " * 4)
    screen = {"width": 1280, "height": 800}
    context = browser.new_context(http_credentials=CREDENTIALS, viewport=screen, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck&error_contains={mark}")
        bottoms = page.evaluate(
            "() => [...document.querySelectorAll('table.rows tbody tr')].map(row => row.getBoundingClientRect().bottom)"
        )
        on_screen = [bottom for bottom in bottoms if bottom <= 800]
        assert len(on_screen) > 8, f"{len(on_screen)} rows on a 1280x800 screen"
        error_cell = page.locator("table.rows td.error-text").first
        assert mark in error_cell.get_attribute("title")  # the whole (listed) text stays one hover away
    finally:
        context.close()


def test_live_refresh_is_off_by_default_and_reloads_a_list_when_ticked(served, browser):
    base_url, harness = served
    mark = f"mark-{uuid.uuid4().hex[:8]}"
    add_webhooks(harness.engine, 1, status="stuck", error=mark)
    context = browser.new_context(http_credentials=CREDENTIALS, java_script_enabled=True)
    try:
        context.clock.install()  # the page's timers run on Playwright's clock: the test moves it 10 s on
        page = context.new_page()
        violations = []
        page.on("console", lambda message: violations.append(message.text) if "Content Security Policy" in message.text else None)
        page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck&error_contains={mark}")
        toggle = page.get_by_label("Live refresh every 10 s")
        assert toggle.is_visible() and not toggle.is_checked()  # off by default
        assert page.locator("table.rows tbody tr").count() == 1

        toggle.check()
        (new_id,) = add_webhooks(harness.engine, 1, status="stuck", error=mark)
        page.clock.fast_forward(9_000)
        assert page.locator(f'a[href$="/rows/{new_id}"]').count() == 0  # not yet: the refresh is due at 10 s
        page.clock.fast_forward(1_000)
        page.locator(f'a[href$="/rows/{new_id}"]').wait_for(timeout=30_000)  # the page reloaded by itself
        assert page.locator("table.rows tbody tr").count() == 2
        # Kept across the reload: the script ticks it again at DOMContentLoaded, which may come after the new row is
        # in the page, so the check waits for it (up to 15 s) instead of reading it at once.
        from playwright.sync_api import expect

        expect(page.get_by_label("Live refresh every 10 s")).to_be_checked(timeout=15_000)
        page.get_by_label("Live refresh every 10 s").uncheck()
        assert page.evaluate("() => sessionStorage.length") == 0
        assert violations == []
    finally:
        context.close()
    without_script = browser.new_context(http_credentials=CREDENTIALS, java_script_enabled=False)
    try:
        page = without_script.new_page()
        page.goto(f"{base_url}/admin/audit")
        assert not page.get_by_label("Live refresh every 10 s").is_visible()  # no script, no toggle to promise
    finally:
        without_script.close()


def test_job_counts_are_formatted_figures_with_names(served, page_factory):
    base_url, harness = served
    counts = {"claimed": 12000, "delivered": 11985, "retried": 0, "stuck": 15, "batches": 120}
    record_run(harness.engine, "outboxkit.drain.webhooks", "webhooks", datetime.now(timezone.utc), counts=counts)
    page = page_factory()
    page.goto(f"{base_url}/admin/schedules")
    cell = page.locator('tr[data-internal-job="outboxkit.drain.webhooks"] .counts')
    assert cell.locator("> span").all_inner_texts() == ["11,985 delivered", "15 stuck", "12,000 claimed", "120 batches"]
    assert "retried" not in cell.inner_text()  # zeros are left out
    page.locator('tr[data-internal-job="outboxkit.drain.webhooks"] td a').first.click()
    assert "11,985 delivered" in page.locator("#job-runs").inner_text()


def test_the_leader_line_keeps_the_layout_on_a_desktop_and_a_phone(served, browser, admin_database_url):
    base_url, harness = served
    host = "worker-7.eu-central-1.compute.example.com"  # as long as a name keeping its pid can be (63 bytes)
    key = harness.kit.settings.advisory_lock_key
    with psycopg.connect(admin_database_url, autocommit=True, application_name=f"outboxkit-leader:{host}:4242") as leader:
        leader.execute("SELECT pg_advisory_lock(%s::bigint)", (key,))
        try:
            for width, height in ((1280, 800), (375, 740)):
                context = browser.new_context(
                    http_credentials=CREDENTIALS, viewport={"width": width, "height": height}, java_script_enabled=False
                )
                try:
                    page = context.new_page()
                    for path in ("/admin/", "/admin/schedules"):
                        page.goto(base_url + path)
                        line = page.locator("#leader")
                        assert f"{host}" in line.inner_text() and "pid 4242" in line.inner_text()
                        assert page.evaluate("() => document.documentElement.scrollWidth") <= width + 1
                        box = line.bounding_box()
                        assert box["x"] + box["width"] <= width + 1
                        if width > 1000:
                            assert box["height"] < 40, f"{path}: the leader line is {box['height']}px tall"
                finally:
                    context.close()
        finally:
            leader.execute("SELECT pg_advisory_unlock(%s::bigint)", (key,))


def test_drain_now_is_offered_while_paused_and_resumes_first(served, page_factory):
    base_url, harness = served
    page = page_factory()
    try:
        harness.client.post("/admin/api/outboxes/webhooks/pause", json={})
        page.goto(f"{base_url}/admin/outboxes/webhooks")
        assert page.locator("#paused").is_visible()
        page.get_by_role("button", name="Drain now").click()
        assert page.get_by_role("heading", level=1).inner_text() == "webhooks is paused: resume and drain now?"
        page.get_by_role("button", name="Resume and drain now").click()
        assert "Resumed, and woke every drain" in page.get_by_role("status").inner_text()
        assert page.locator("#paused").count() == 0
    finally:
        with harness.engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM outboxkit_outbox_pauses")
        harness.kit.drainer("webhooks").pause_check.forget()
