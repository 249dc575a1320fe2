"""The schedules list a page at a time in a real headless Chromium (JavaScript off: the pages need none).

45 schedules, 20 a page: the page size chosen on the page, then next, next (the last page), previous; the
viewer's timezone asked for stays on every page, and an action pressed on a later page comes back to it; a
cursor that does not decode is an error page naming it, and changes nothing.  The app and its fixtures are
those of ``test_schedules_browser``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from outboxkit import ManualClock
from outboxkit.operations.schedule_admin import ScheduleAdmin
from outboxkit.operations.schedule_schemas import ScheduleCreate
from tests.support.admin import (
    ServedApp,
    admin_database_url,  # noqa: F401  (fixture)
)
from tests.support.chromium import require_chromium
from tests.support.schedule_admin import JOBS, ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)
NAMES = [f"report-{number:02d}" for number in range(1, 46)]


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, ScheduleAdminApp]]:
    require_chromium()
    with schedule_admin_app(admin_database_url, clock=ManualClock(START)) as harness, ServedApp(harness.app) as base_url:
        harness.clear()
        admin = ScheduleAdmin(harness.kit, jobs=JOBS)
        for name in NAMES:
            admin.create(ScheduleCreate.model_validate({
                "name": name, "trigger": {"kind": "every", "fields": {"hours": 1}}, "target": {"kind": "job", "job": "record"},
            }), actor="alice")
        yield base_url, harness


def listed(page) -> list[str]:
    # A click on a link returns once the next page's navigation has committed, before its rows are parsed.
    page.wait_for_load_state()
    return [name for name in page.locator("tr[data-schedule]").evaluate_all("rows => rows.map(r => r.dataset.schedule)")]


def schedule_state(harness: ScheduleAdminApp) -> list[tuple[object, ...]]:
    with harness.engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM outboxkit_schedules ORDER BY id")).all()
        audit = connection.execute(text("SELECT count(*) FROM outboxkit_schedule_audit")).all()
    return [tuple(row) for row in rows] + [tuple(row) for row in audit]


def test_page_through_the_schedules_keeping_the_page_size_and_the_viewers_timezone(served, page_factory):
    base_url, harness = served
    page = page_factory()
    page.goto(f"{base_url}/admin/schedules")
    assert listed(page) == NAMES[:45] and page.get_by_role("link", name="Next page →").count() == 0  # 50 a page

    page.get_by_label("Your timezone").fill("Asia/Tokyo")
    page.get_by_role("button", name="Show times").click()
    page.get_by_label("Schedules per page").select_option("20")
    page.get_by_role("button", name="Show", exact=True).click()
    assert listed(page) == NAMES[:20]
    assert page.get_by_role("link", name="← Previous page").count() == 0

    page.get_by_role("link", name="Next page →").click()
    assert listed(page) == NAMES[20:40]
    assert "tz=Asia%2FTokyo" in page.url and "limit=20" in page.url
    assert page.locator("time[data-viewer-time]").first.inner_text().endswith(" JST")  # Tokyo, asked on page one
    page.get_by_role("link", name="Next page →").click()
    assert listed(page) == NAMES[40:]
    assert page.get_by_role("link", name="Next page →").count() == 0

    page.get_by_role("link", name="← Previous page").click()
    assert listed(page) == NAMES[20:40]
    page.get_by_role("link", name="← Previous page").click()
    assert listed(page) == NAMES[:20] and page.get_by_role("link", name="← Previous page").count() == 0
    assert page.get_by_label("Schedules per page").input_value() == "20"
    assert page.get_by_label("Your timezone").input_value() == "Asia/Tokyo"

    # An action pressed on a later page comes back to that page (its size, zone and cursor kept).
    page.get_by_role("link", name="Next page →").click()
    row = page.locator(f'tr[data-schedule="{NAMES[25]}"]')
    row.locator('button[data-action="disable"]').click()
    assert "Disabled" in page.get_by_role("status").inner_text()
    assert listed(page) == NAMES[20:40] and "tz=Asia%2FTokyo" in page.url and "limit=20" in page.url
    assert page.locator(f'tr[data-schedule="{NAMES[25]}"] .badge').inner_text() == "disabled"
    assert ScheduleAdmin(harness.kit, jobs=JOBS).schedule(NAMES[25]).definition.enabled is False


def test_a_bad_cursor_or_page_size_is_an_error_page_naming_it_and_changes_nothing(served, page_factory):
    base_url, harness = served
    before = schedule_state(harness)
    page = page_factory()
    answer = page.goto(f"{base_url}/admin/schedules?cursor=not-a-cursor")
    assert answer is not None and answer.status == 400
    assert "cursor does not decode" in page.content()
    answer = page.goto(f"{base_url}/admin/schedules?limit=201")
    assert answer is not None and answer.status == 422
    assert "the page size must be a whole number from 1 to 200" in page.content()
    assert schedule_state(harness) == before


def test_each_rows_buttons_are_named_with_their_schedule(served, page_factory):
    base_url, _ = served
    page = page_factory()
    page.goto(f"{base_url}/admin/schedules")

    for label in ("Disable report-01", "Run now report-01", "Delete… report-01"):
        assert page.get_by_role("button", name=label, exact=True).count() == 1, label
    assert page.get_by_role("link", name="Edit report-02", exact=True).count() == 1
    assert page.get_by_role("button", name="Disable", exact=True).count() == 0  # no bare, ambiguous names
