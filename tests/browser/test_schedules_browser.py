"""The schedule pages in a real headless Chromium: list, create (a field error first), edit, disable and
enable, run now, delete, history; and the viewer's timezone with and without JavaScript.

The app is the admin router over a kit that knows the ``ScheduledCall`` outbox and the test jobs
(tests/support/schedule_admin.py), on a ManualClock at ``START``, served by uvicorn on 127.0.0.1.  The
flows run with JavaScript disabled, which proves the pages need none; the viewer's timezone is checked both
ways.  Without /usr/bin/chromium these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from outboxkit import ManualClock
from tests.support.admin import (
    ServedApp,
    admin_database_url,  # noqa: F401  (fixture)
)
from tests.support.chromium import require_chromium
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, ScheduleAdminApp]]:
    require_chromium()
    with schedule_admin_app(admin_database_url, clock=ManualClock(START)) as harness, ServedApp(harness.app) as base_url:
        yield base_url, harness


@pytest.fixture
def site(served) -> tuple[str, ScheduleAdminApp]:
    base_url, harness = served
    harness.clear()
    harness.kit.clock.set(START)  # type: ignore[attr-defined]
    return base_url, harness


def schedule_rows(harness: ScheduleAdminApp) -> list[tuple[object, ...]]:
    with harness.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            text("SELECT name, timezone, trigger_fields, enabled, next_run_at FROM outboxkit_schedules ORDER BY name")
        )]


def create_through_the_form(page, base_url: str, *, name: str, fields: str, zone: str = "Europe/Berlin") -> None:
    page.goto(f"{base_url}/admin/schedules")
    page.get_by_role("link", name="New schedule").click()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Trigger", exact=True).select_option("cron")
    page.get_by_label("Trigger fields").fill(fields)
    page.get_by_label("Timezone").fill(zone)
    page.get_by_label("Job", exact=True).fill("record")
    page.get_by_role("button", name="Create schedule").click()


def test_create_with_a_field_error_then_list_with_the_next_five_fire_times(site, page_factory):
    base_url, harness = site
    page = page_factory()

    create_through_the_form(page, base_url, name="partner.nightly", fields="hour=3\nminute=30", zone="Europe/Berlni")
    error = page.locator("#error-timezone")
    assert "trigger.timezone: unknown IANA timezone 'Europe/Berlni'" in error.inner_text()
    assert page.get_by_label("Timezone").get_attribute("aria-describedby") == "error-timezone"
    assert page.get_by_label("Trigger fields").input_value() == "hour=3\nminute=30"  # what was typed stays
    assert "Nothing was changed" in page.locator("#form-refused").inner_text()
    assert schedule_rows(harness) == []

    page.get_by_label("Timezone").fill("Europe/Berlin")
    page.get_by_role("button", name="Create schedule").click()
    assert "Created" in page.get_by_role("status").inner_text()
    assert page.locator("h1").inner_text() == "Schedule partner.nightly"

    page.get_by_role("link", name="← Schedules").click()
    row = page.locator('tr[data-schedule="partner.nightly"]')
    local = row.locator("time[data-schedule-time]").all_inner_texts()
    assert local == [  # Berlin springs forward on 2026-03-29
        "2026-03-28 03:30:00 CET", "2026-03-29 03:30:00 CEST", "2026-03-30 03:30:00 CEST",
        "2026-03-31 03:30:00 CEST", "2026-04-01 03:30:00 CEST",
    ]
    assert row.locator("time[data-viewer-time]").first.inner_text() == "2026-03-28 02:30:00 UTC"  # no JS, no tz: UTC
    assert "job record" in row.inner_text() and "enabled" in row.inner_text()

    page.get_by_label("Your timezone").fill("Asia/Tokyo")
    page.get_by_role("button", name="Show times").click()
    assert page.locator("time[data-viewer-time]").first.inner_text() == "2026-03-28 11:30:00 JST"


def test_the_viewer_column_follows_the_browsers_timezone_with_javascript(site, page_factory):
    base_url, harness = site
    page = page_factory()
    create_through_the_form(page, base_url, name="tick", fields="minute=*/15", zone="UTC")

    viewer = page_factory(javascript=True, timezone_id="America/New_York")
    viewer.goto(f"{base_url}/admin/schedules")
    viewer.locator("body[data-viewer-zone='America/New_York']").wait_for()
    first = viewer.locator('tr[data-schedule="tick"] time[data-viewer-time]').first.inner_text()
    assert first.startswith("2026-03-27 08:00:00")  # 12:00 UTC is 08:00 in New York (EDT since March 8)
    assert viewer.locator("th [data-viewer-zone-name]").inner_text() == "America/New_York"
    assert viewer.get_by_label("Your timezone").input_value() == "America/New_York"
    assert viewer.locator("time[data-schedule-time]").first.inner_text() == "2026-03-27 12:00:00 UTC"


def test_edit_disable_enable_run_now_and_delete(site, page_factory):
    base_url, harness = site
    page = page_factory()
    create_through_the_form(page, base_url, name="tick", fields="minute=*/15", zone="UTC")

    page.get_by_role("link", name="Edit").click()
    assert page.get_by_label("Trigger fields").input_value() == "minute=*/15"
    page.get_by_label("Trigger fields").fill("minute=0\nhour=*/2")
    page.get_by_label("Misfire grace (seconds)").fill("900")
    page.get_by_role("button", name="Save").click()
    assert "Saved" in page.get_by_role("status").inner_text()
    assert page.locator("#schedule-grace").inner_text() == "900 s"
    assert schedule_rows(harness)[0][2] == {"minute": 0, "hour": "*/2"}

    page.get_by_role("link", name="← Schedules").click()
    row = page.locator('tr[data-schedule="tick"]')
    row.get_by_role("button", name="Disable").click()
    assert "Disabled" in page.get_by_role("status").inner_text()
    assert "none while disabled" in row.inner_text() and schedule_rows(harness)[0][3] is False
    row.get_by_role("button", name="Enable").click()
    assert "Enabled" in page.get_by_role("status").inner_text()
    assert schedule_rows(harness)[0][3] is True

    harness.kit.clock.advance(minutes=7)  # type: ignore[attr-defined]
    row.get_by_role("button", name="Run now").click()
    assert "Due now" in page.get_by_role("status").inner_text()
    assert schedule_rows(harness)[0][4] == START + timedelta(minutes=7)

    row.get_by_role("button", name="Delete…").click()
    assert page.locator("h1").inner_text() == "Delete the schedule tick?"
    assert schedule_rows(harness) != []  # the confirmation page changes nothing
    page.get_by_role("button", name="Delete schedule").click()
    assert "Deleted" in page.get_by_role("status").inner_text()
    assert page.locator("#no-schedules").is_visible() and schedule_rows(harness) == []

    with harness.engine.connect() as connection:
        trail = connection.execute(text("SELECT action, actor FROM outboxkit_schedule_audit ORDER BY id")).all()
    assert [tuple(entry) for entry in trail] == [
        ("create", "admin"), ("edit", "admin"), ("disable", "admin"), ("enable", "admin"), ("run_now", "admin"),
        ("delete", "admin"),
    ]


def test_the_history_shows_runs_misses_and_abandoned_runs_paged(site, page_factory):
    base_url, harness = site
    page = page_factory()
    create_through_the_form(page, base_url, name="tick", fields="minute=*", zone="UTC")
    for minute in range(55):  # 55 occurrences: a page of 50, then 5 older ones
        outcome = "missed" if minute == 3 else "abandoned" if minute == 4 else "ok"
        error = "the process died" if outcome == "abandoned" else None
        harness.record_run("tick", START - timedelta(minutes=60 - minute), outcome, error=error)

    page.goto(f"{base_url}/admin/schedules/tick")
    history = page.locator("#schedule-history tbody tr")
    assert history.count() == 50
    assert "ok" in history.first.inner_text()
    page.locator("#older-runs").click()
    older = page.locator("#schedule-history tbody tr")
    assert [line.split("\t")[1].strip() for line in older.all_inner_texts()] == ["abandoned", "missed", "ok", "ok", "ok"]
    assert "the process died" in older.first.inner_text()

    page.get_by_label("Outcome").select_option("missed")
    page.get_by_role("button", name="Show", exact=True).click()
    assert page.locator("#schedule-history tbody tr").count() == 1
    assert "missed" in page.locator("#schedule-history tbody tr").inner_text()
    assert [line.split("\t")[2] for line in page.locator("#schedule-audit tbody tr").all_inner_texts()] == ["create"]
