"""One scheduling page in a real headless Chromium (JavaScript off): a user's schedule and the kit's internal jobs
on the Schedules page, the internal ones read-only and labelled, each with its runs a click away; an old Jobs
bookmark lands there; the navigation has one entry.  The app is the one of ``test_schedules_browser``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import ManualClock
from tests.support.admin import (
    ServedApp,
    admin_database_url,  # noqa: F401  (fixture)
)
from tests.support.chromium import require_chromium
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)
DRAIN = "outboxkit.drain.webhooks"


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, ScheduleAdminApp]]:
    require_chromium()
    with schedule_admin_app(admin_database_url, clock=ManualClock(START)) as harness, ServedApp(harness.app) as base_url:
        harness.clear()
        created = harness.client.post("/admin/api/schedules/new", json={
            "name": "billing.nightly", "trigger": {"kind": "cron", "fields": {"hour": 2}, "timezone": "Europe/Berlin"},
            "target": {"kind": "job", "job": "record"},
        })
        assert created.status_code == 200, created.text
        harness.record_run(DRAIN, START - timedelta(minutes=2), "ok", counts='{"delivered": 4}')
        harness.record_run(DRAIN, START - timedelta(minutes=1), "error", error="receiver answered 503")
        yield base_url, harness


def test_a_user_schedule_and_the_internal_jobs_on_one_page_from_an_old_jobs_bookmark(served, page_factory):
    base_url, _ = served
    page = page_factory()

    page.goto(f"{base_url}/admin/jobs")  # the old Jobs page, bookmarked

    assert page.url == f"{base_url}/admin/schedules#internal-jobs"
    assert page.locator("h1").inner_text() == "Schedules"
    nav = page.locator("header nav")
    assert nav.get_by_role("link", name="Schedules").count() == 1 and nav.get_by_role("link", name="Jobs").count() == 0
    assert page.locator('tr[data-schedule="billing.nightly"]').is_visible()

    internal = page.locator("#internal-jobs-table")
    drain = internal.locator(f'tr[data-internal-job="{DRAIN}"]')
    assert drain.is_visible()
    assert "internal" in drain.locator(".badge-internal").inner_text()
    assert "every minute (UTC)" in drain.inner_text()
    assert "error" in drain.locator(".badge-run-error").inner_text() and "receiver answered 503" in drain.inner_text()
    assert internal.locator('tr[data-internal-job="outboxkit.drain.scheduled-calls"]').is_visible()
    assert internal.locator('tr[data-internal-job="billing.nightly"]').count() == 0  # a schedule is not a job
    assert internal.locator("button, form, input").count() == 0  # read-only

    drain.get_by_role("link", name="webhooks").click()
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == f"Internal job {DRAIN}"
    assert "Read-only" in page.locator("#job-kind").inner_text()
    runs = page.locator("#job-runs tbody tr")
    assert runs.count() == 2 and "error" in runs.nth(0).inner_text() and "4 delivered" in runs.nth(1).inner_text()

    page.get_by_role("link", name="← Schedules").click()
    page.wait_for_load_state()
    assert page.locator("#internal-jobs").is_visible()
