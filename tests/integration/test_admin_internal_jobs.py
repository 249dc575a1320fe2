"""One scheduling concept in the admin: the jobs the elected leader runs are listed with the schedules (page and
API), read-only and marked internal, with their runs; the old Jobs page redirects there and the old jobs API is
marked deprecated in the OpenAPI schema while it keeps answering."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from outboxkit.schedules import ScheduleTrigger
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.schedule_admin import (  # noqa: F401  (fixtures)
    START,
    ScheduleAdminApp,
    schedule_admin,
    schedule_admin_module,
)

DRAIN = "outboxkit.drain.webhooks"
NIGHTLY = {
    "name": "partner.nightly",
    "trigger": {"kind": "cron", "fields": {"hour": 3, "minute": 30}, "timezone": "Europe/Berlin"},
    "target": {"kind": "job", "job": "record"},
}


@pytest.fixture
def api(schedule_admin: ScheduleAdminApp) -> ScheduleAdminApp:
    return schedule_admin


def test_the_schedules_list_carries_the_internal_jobs_read_only_and_marked(api: ScheduleAdminApp):
    assert api.client.post("/admin/api/schedules/new", json=NIGHTLY).status_code == 200
    api.record_run(DRAIN, START - timedelta(minutes=1), "ok", counts='{"delivered": 3}')

    listing = api.client.get("/admin/api/schedules").json()

    assert [schedule["name"] for schedule in listing["schedules"]] == ["partner.nightly"]
    internal = {job["id"]: job for job in listing["internal_jobs"]["jobs"]}
    assert set(internal) == {DRAIN, "outboxkit.drain.scheduled-calls"}  # a schedule is never listed as a job
    drain = internal[DRAIN]
    assert drain["internal"] is True and drain["read_only"] is True
    assert drain["schedule"] == "every minute (UTC)" and drain["next_run_at"] is not None
    assert drain["last_run"]["outcome"] == "ok" and drain["last_run"]["counts"] == {"delivered": 3}
    assert listing["internal_jobs"]["source"] == "job_source"
    assert api.client.get("/admin/api/schedules/_internal").json() == listing["internal_jobs"]


def test_an_internal_jobs_runs_newest_first_and_unknown_ids_are_404(api: ScheduleAdminApp):
    api.record_run(DRAIN, START - timedelta(minutes=2), "ok")
    api.record_run(DRAIN, START - timedelta(minutes=1), "error", error="receiver down")
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)

    runs = api.client.get(f"/admin/api/schedules/_internal/{DRAIN}/runs", params={"limit": 1}).json()

    assert runs["job_id"] == DRAIN and [run["outcome"] for run in runs["runs"]] == ["error"]
    assert api.client.get("/admin/api/schedules/_internal/app.nope/runs").status_code == 404
    assert api.client.get("/admin/api/schedules/_internal/partner.nightly/runs").status_code == 404  # a schedule
    assert api.client.get("/admin/api/schedules/partner.nightly/history").status_code == 200  # its runs are there
    assert api.client.get("/admin/api/schedules/_internal/outboxkit.drain.scheduled-calls/runs").json()["runs"] == []


def test_a_job_still_registered_with_kit_scheduler_add_job_is_listed_as_not_internal(api: ScheduleAdminApp):
    with pytest.warns(DeprecationWarning, match="kit.scheduler.add_job is deprecated"):
        api.kit.scheduler.add_job("app.legacy", lambda context: None, ScheduleTrigger.cron(hour=2), name="legacy")
    try:
        listing = api.client.get("/admin/api/schedules").json()
        page = api.client.get("/admin/schedules").text
    finally:
        api.kit.scheduler.remove_job("app.legacy")
    legacy = next(job for job in listing["internal_jobs"]["jobs"] if job["id"] == "app.legacy")
    assert legacy["internal"] is False and legacy["read_only"] is True
    assert legacy["schedule"] == "every day at 02:00 (UTC)"
    row = re.search(r'<tr data-internal-job="app.legacy">.*?</tr>', page, re.S)
    assert row is not None and ">deprecated</span>" in row.group(0)


def test_the_old_jobs_api_still_answers_and_is_deprecated_in_the_schema(api: ScheduleAdminApp):
    schema = api.app.openapi()["paths"]
    listing, runs = schema["/admin/api/jobs"]["get"], schema["/admin/api/jobs/{job_id}/runs"]["get"]
    assert listing["deprecated"] is True and "/api/schedules/_internal" in listing["summary"]
    assert runs["deprecated"] is True and "/api/schedules/_internal/{job_id}/runs" in runs["summary"]
    new_routes = [schema["/admin/api/schedules/_internal"]["get"], schema["/admin/api/schedules/_internal/{job_id}/runs"]["get"]]
    assert not any(route.get("deprecated") for route in new_routes)
    assert api.client.get("/admin/api/jobs").status_code == 200
    assert api.client.get(f"/admin/api/jobs/{DRAIN}/runs").status_code == 200


def test_the_old_jobs_pages_redirect_to_the_schedules_page(api: ScheduleAdminApp):
    jobs = api.client.get("/admin/jobs")
    job = api.client.get("/admin/jobs/reports%2Fdaily")
    assert (jobs.status_code, jobs.headers["location"]) == (303, "/admin/schedules#internal-jobs")
    assert (job.status_code, job.headers["location"]) == (303, "/admin/schedules/_internal/reports%2Fdaily")
    assert api.client.get("/admin/jobs", follow_redirects=True).url.path == "/admin/schedules"


def test_one_page_lists_schedules_and_internal_jobs_and_the_navigation_has_one_entry(api: ScheduleAdminApp):
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    api.record_run(DRAIN, START - timedelta(minutes=1), "error", error="receiver down")

    page = api.client.get("/admin/schedules").text

    assert 'data-schedule="partner.nightly"' in page
    drain = re.search(rf'<tr data-internal-job="{re.escape(DRAIN)}">.*?</tr>', page, re.S)
    assert drain is not None and ">internal</span>" in drain.group(0) and "badge-run-error" in drain.group(0)
    assert f'href="/admin/schedules/_internal/{DRAIN}"' in drain.group(0)
    assert ">Schedules</a>" in page and ">Jobs</a>" not in page
    assert "<form" not in page[page.index('id="internal-jobs"') :]  # read-only: no action there


def test_an_internal_jobs_page_shows_its_facts_and_runs_read_only(api: ScheduleAdminApp):
    api.record_run(DRAIN, START - timedelta(minutes=1), "ok", counts='{"delivered": 7}')

    page = api.client.get(f"/admin/schedules/_internal/{DRAIN}")

    assert page.status_code == 200 and 'id="job-runs"' in page.text and "<b>7</b> delivered" in page.text
    assert ">internal</span>" in page.text and "Read-only" in page.text
    assert '<a href="/admin/schedules#internal-jobs">← Schedules</a>' in page.text
    assert "<form" not in page.text[page.text.index("<main>") :]
    assert api.client.get("/admin/schedules/_internal/app.nope").status_code == 404
