"""The elected jobs in the admin: schedules in words with their timezone, run history per job, failure counts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outboxkit.operations.service import OperationsService
from outboxkit.schedules import ScheduleTrigger
from tests.support.admin import (  # noqa: F401  (fixtures)
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    empty_tables,
    record_run,
)


@pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")
def test_a_kit_scheduler_as_job_source_shows_trigger_objects_in_words(admin_database_url, clock):
    empty_tables(admin_database_url)
    with admin_harness(admin_database_url, clock=clock) as harness:
        scheduler = harness.kit.scheduler  # the registry; no election runs here
        trigger = ScheduleTrigger.cron(timezone="Europe/Berlin", hour=2, minute=0)
        scheduler.add_job("app.nightly", lambda context: None, trigger, name="nightly")
        view = OperationsService(harness.kit, job_source=scheduler).jobs()
    jobs = {job.id: job for job in view.jobs}
    assert jobs["app.nightly"].schedule == "every day at 02:00 (Europe/Berlin)"
    assert jobs["outboxkit.drain.webhooks"].schedule == "every minute (UTC)"
    assert "cron[" in jobs["app.nightly"].trigger  # the raw text stays available


def test_a_jobs_run_history_newest_first_with_duration_outcome_counts_and_errors(admin):
    now = admin.clock.now()
    job_id = "outboxkit.drain.webhooks"
    record_run(admin.engine, job_id, "webhooks", now - timedelta(minutes=3), "ok", {"delivered": 7})
    record_run(admin.engine, job_id, "webhooks", now - timedelta(minutes=2), "error")
    record_run(admin.engine, job_id, "webhooks", now - timedelta(minutes=1), "ok", {"delivered": 2})

    history = admin.client.get(f"/admin/api/schedules/_internal/{job_id}/runs", params={"limit": 2}).json()
    page = admin.client.get(f"/admin/schedules/_internal/{job_id}")

    assert [run["outcome"] for run in history["runs"]] == ["ok", "error"]
    assert history["runs"][0]["counts"] == {"delivered": 2} and history["runs"][0]["duration_seconds"] == 0
    assert page.status_code == 200 and 'id="job-runs"' in page.text
    assert page.text.count("badge-run-error") == 1 and "<b>7</b> delivered" in page.text
    assert "1 of the 3 kept runs" in page.text
    # The deprecated route answers the same.
    assert admin.client.get(f"/admin/api/jobs/{job_id}/runs", params={"limit": 2}).json() == history


def test_an_unknown_job_is_404_and_a_drain_without_runs_is_an_empty_history(admin):
    assert admin.client.get("/admin/api/schedules/_internal/app.nope/runs").status_code == 404
    assert admin.client.get("/admin/api/jobs/app.nope/runs").status_code == 404
    assert admin.client.get("/admin/schedules/_internal/app.nope").status_code == 404
    assert admin.client.get("/admin/api/schedules/_internal/outboxkit.drain.webhooks/runs").json()["runs"] == []
    assert "No run recorded yet" in admin.client.get("/admin/schedules/_internal/outboxkit.drain.webhooks").text
