"""A run whose scheduler died mid-run: the next scheduler marks it ``abandoned``, and the admin shows it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.schedules.jobs import every, once
from outboxkit.storage.tables import job_runs
from tests.support.admin import admin_harness, empty_tables
from tests.support.database import sqlalchemy_url
from tests.support.drain_worker import worker_environment
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent

UTC = timezone.utc
QUIET = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False)
FAR_FUTURE = datetime(2099, 1, 1, tzinfo=UTC)

# A leader whose job hangs: it runs one occurrence and says so, then waits to be killed.
HANGING_LEADER = textwrap.dedent(
    """
    import sys, threading, warnings
    from datetime import datetime, timezone
    from sqlalchemy import create_engine
    from outboxkit import OutboxKit, OutboxKitSettings
    from outboxkit.schedules.jobs import every
    from tests.support.models import SampleEvent

    kit = OutboxKit(create_engine(sys.argv[1]), [SampleEvent],
                    settings=OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False))

    def hang(context):
        print("started", flush=True)
        threading.Event().wait()

    warnings.filterwarnings("ignore", "kit.scheduler.add_job is deprecated", DeprecationWarning)  # an elected job, on purpose
    kit.scheduler.add_job("test.nightly", hang, every(hours=24))
    kit.scheduler.run_job("test.nightly", scheduled_for=datetime(2030, 1, 1, tzinfo=timezone.utc))
    """
)

# These tests exercise the elected scheduler's registry through kit.scheduler.add_job, deprecated but kept
# working (tests/integration/test_scheduler_deprecation.py pins its warning).
pytestmark = pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")


def runs(engine, job_id: str) -> list[dict]:
    with engine.connect() as connection:
        rows = connection.execute(select(job_runs).where(job_runs.c.job_id == job_id).order_by(job_runs.c.id))
        return [dict(row._mapping) for row in rows]


def test_a_leader_killed_mid_job_leaves_a_run_the_next_leader_marks_abandoned(engine, database_url):
    leader = subprocess.Popen(
        [sys.executable, "-c", HANGING_LEADER, sqlalchemy_url(database_url)],
        stdout=subprocess.PIPE,
        env=worker_environment(),
        text=True,
    )
    try:
        assert leader.stdout.readline().strip() == "started"
        [run] = runs(engine, "test.nightly")
        assert run["outcome"] == "running"
    finally:
        leader.kill()  # SIGKILL: no finally block, no clean-up in the dead leader
        leader.wait(timeout=30)
    assert runs(engine, "test.nightly")[0]["outcome"] == "running"  # and it would stay so forever

    kit = OutboxKit(engine, [SampleEvent], settings=QUIET)
    try:
        kit.scheduler.add_job("test.nightly", lambda context: None, every(hours=24))
        kit.scheduler.start()  # the new leader's scheduler
        [run] = runs(engine, "test.nightly")
        assert run["outcome"] == "abandoned"
        assert run["finished_at"] is None  # when it really ended is unknown
        assert f":{leader.pid} " in run["error"] and "never finished" in run["error"]
        assert f"marked abandoned by {socket.gethostname()}:{os.getpid()}" in run["error"]  # who marked it
    finally:
        kit.close()


def test_only_this_kits_running_jobs_are_marked_and_finished_runs_are_left_alone(engine):
    with engine.begin() as connection:
        for job_id, outcome in [("test.mine", "running"), ("test.mine-done", "ok"), ("other-kit.job", "running")]:
            connection.execute(
                job_runs.insert().values(
                    job_id=job_id, job_name=job_id, scheduled_for=FAR_FUTURE, outcome=outcome, leader="old-host:7"
                )
            )
    kit = OutboxKit(engine, [SampleEvent], settings=QUIET)
    try:
        for job_id in ("test.mine", "test.mine-done"):
            kit.scheduler.add_job(job_id, lambda context: None, once(FAR_FUTURE))
        kit.scheduler.start()
    finally:
        kit.close()
    assert runs(engine, "test.mine")[0]["outcome"] == "abandoned"
    assert runs(engine, "test.mine-done")[0]["outcome"] == "ok"
    assert runs(engine, "other-kit.job")[0]["outcome"] == "running"  # another application's job in a shared database


def test_a_run_still_finishing_under_an_old_leader_records_its_real_outcome_over_abandoned(engine):
    # The two-believer window: the old leader lost the lock but its job still runs when the new one starts.
    release = threading.Event()
    old, new = (OutboxKit(engine, [SampleEvent], settings=QUIET) for _ in range(2))
    try:
        old.scheduler.add_job("test.slow", lambda context: release.wait(30) and {"rows": 3}, every(hours=1))
        new.scheduler.add_job("test.slow", lambda context: None, every(hours=1))
        worker = threading.Thread(
            target=old.scheduler.run_job, args=("test.slow",), kwargs={"scheduled_for": datetime(2030, 1, 1, tzinfo=UTC)}
        )
        worker.start()
        wait_until(lambda: runs(engine, "test.slow"), message="the old leader's run starting")
        new.scheduler.start()
        assert runs(engine, "test.slow")[0]["outcome"] == "abandoned"
        release.set()
        worker.join(timeout=30)
        [run] = runs(engine, "test.slow")
        assert (run["outcome"], run["counts"], run["error"]) == ("ok", {"rows": 3}, None)
    finally:
        release.set()
        old.close()
        new.close()


@pytest.fixture
def admin_database(database_factory):
    url = database_factory.create()
    yield url
    database_factory.drop(url)


def test_the_admin_shows_an_abandoned_run_as_the_jobs_last_outcome(admin_database):
    empty_tables(admin_database)
    with admin_harness(admin_database) as harness:
        with harness.engine.begin() as connection:
            connection.execute(
                job_runs.insert().values(
                    job_id="app.report", job_name="nightly report", leader="old-host:7",
                    scheduled_for=datetime.now(UTC) - timedelta(hours=1),
                )
            )
        harness.kit.scheduler.add_job("app.report", lambda context: None, once(FAR_FUTURE), name="nightly report")
        assert harness.kit.scheduler.runner.abandon_unfinished(["app.report"]) == 1
        internal = harness.client.get("/admin/api/schedules/_internal").json()["jobs"]
        last_run = next(job for job in internal if job["id"] == "app.report")["last_run"]
        assert last_run["outcome"] == "abandoned"
        assert "old-host:7" in last_run["error"]
        page = harness.client.get("/admin/schedules")
        assert page.status_code == 200 and "badge-run-abandoned" in page.text
