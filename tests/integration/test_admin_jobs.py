"""The jobs page: schedules in words with their timezone, run history per job, failure counts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outboxkit.operations.service import OperationsService
from outboxkit.schedules.jobs import cron
from tests.support.admin import (  # noqa: F401  (fixtures)
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    empty_tables,
    record_run,
)

# These tests exercise the elected scheduler's registry through kit.scheduler.add_job, deprecated but kept
# working (tests/integration/test_scheduler_deprecation.py pins its warning).
pytestmark = pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")


def test_a_kit_scheduler_as_job_source_shows_trigger_objects_in_words(admin_database_url, clock):
    empty_tables(admin_database_url)
    with admin_harness(admin_database_url, clock=clock) as harness:
        scheduler = harness.kit.scheduler  # the registry; no election runs here
        scheduler.add_job("app.nightly", lambda context: None, cron(timezone="Europe/Berlin", hour=2, minute=0), name="nightly")
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

    history = admin.client.get(f"/admin/api/jobs/{job_id}/runs", params={"limit": 2}).json()
    page = admin.client.get(f"/admin/jobs/{job_id}")

    assert [run["outcome"] for run in history["runs"]] == ["ok", "error"]
    assert history["runs"][0]["counts"] == {"delivered": 2} and history["runs"][0]["duration_seconds"] == 0
    assert page.status_code == 200 and 'id="job-runs"' in page.text
    assert page.text.count("badge-run-error") == 1 and "<b>7</b> delivered" in page.text
    assert "1 of the 3 kept runs" in page.text


def test_an_unknown_job_is_404_and_a_drain_without_runs_is_an_empty_history(admin):
    assert admin.client.get("/admin/api/jobs/app.nope/runs").status_code == 404
    assert admin.client.get("/admin/jobs/app.nope").status_code == 404
    assert admin.client.get("/admin/api/jobs/outboxkit.drain.webhooks/runs").json()["runs"] == []
    assert "No run recorded yet" in admin.client.get("/admin/jobs/outboxkit.drain.webhooks").text
