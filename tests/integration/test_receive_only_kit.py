"""A kit for a service that only receives: no outboxes, and the inbox's retention, admin page and metrics still there.

``OutboxKit.receive_only(engine)`` builds a kit without outboxes.  Its lifespan
elects a leader that runs the inbox's retention; the admin's Inbox page and
API answer; ``OutboxMetrics`` counts the inbox; what needs an outbox says so
and changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.admin import create_admin_router
from outboxkit.errors import ConfigurationError, UnknownOutboxError
from outboxkit.inbox import INBOX_RETENTION_JOB_ID, InboxConsumer
from outboxkit.integration import readiness
from outboxkit.metrics.prometheus import OutboxMetrics
from tests.support.cli import cli_fixture
from tests.support.database import sqlalchemy_url
from tests.support.inbox import apply, create_applied_table, records
from tests.support.inbox_brokers import SOURCE
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.worker_app import RECEIVE_ONLY_APP, worker_command

cli = cli_fixture(["--app", RECEIVE_ONLY_APP])


@pytest.fixture
def kit(engine, clock):
    made = OutboxKit.receive_only(
        engine, settings=OutboxKitSettings(inbox_retention_days=7, leader_tick_seconds=0.2), clock=clock
    )
    yield made
    made.close()


def test_the_elected_leader_prunes_the_inbox_of_a_kit_without_outboxes(kit, engine, clock):
    create_applied_table(engine)
    consumer = InboxConsumer(engine, source=SOURCE)
    consumer.consume("old", lambda session: apply(session, "old"))
    app = FastAPI(lifespan=kit.lifespan)
    with TestClient(app):
        wait_until(lambda: kit.scheduler.running, timeout=60, message="the kit elected and its scheduler running")
        assert {job.id for job in kit.scheduler.jobs()} >= {INBOX_RETENTION_JOB_ID}
        assert not [job for job in kit.scheduler.jobs() if job.id.startswith("outboxkit.drain")]
        assert readiness(kit) is None  # ready without drain loops: it has none to run
        clock.advance(days=8)
        record = kit.scheduler.run_job(INBOX_RETENTION_JOB_ID, scheduled_for=clock.now() - timedelta(seconds=1))
        assert (record.outcome, record.counts) == ("ok", {"deleted": 1})
    assert records(engine) == set()


def test_the_admin_shows_the_inbox_and_the_metrics_count_it(kit, engine):
    create_applied_table(engine)
    metrics = OutboxMetrics(kit, refresh_seconds=3600)
    try:
        consumer = InboxConsumer(engine, source=SOURCE, observers=[metrics.inbox])
        consumer.consume("m-1", lambda session: apply(session, "m-1"))
        consumer.consume("m-1", lambda session: apply(session, "m-1"))
        app = FastAPI()
        app.include_router(create_admin_router(kit, insecure_no_auth=True), prefix="/admin")
        with TestClient(app) as client:
            sources = client.get("/admin/api/inbox").json()
            assert [(source["source"], source["received"], source["duplicates"]) for source in sources["sources"]] == [
                (SOURCE, 1, 1)
            ]
            page = client.get("/admin/inbox")
            assert page.status_code == 200 and SOURCE in page.text
            overview = client.get("/admin/")  # nothing to show but the inbox: the overview is the Inbox page
            assert overview.url.path == "/admin/inbox" and SOURCE in overview.text
            for path in ("/admin/jobs", "/admin/api/outboxes", "/admin/api/jobs", "/admin/api/audit"):
                assert client.get(path).status_code == 200, path
        assert metrics.registry.get_sample_value(
            "outboxkit_inbox_messages_total", {"source": SOURCE, "outcome": "duplicate"}
        ) == 1
    finally:
        metrics.close()


def test_what_needs_an_outbox_says_so(kit):
    for attempt in (lambda: kit.drain_once("orders"), lambda: kit.options("orders"), lambda: kit.outbox(SampleEvent)):
        with pytest.raises(UnknownOutboxError, match="only receives"):
            attempt()
    assert kit.outboxes == []


def test_a_kit_with_no_outboxes_is_refused_unless_it_says_it_only_receives(engine):
    with pytest.raises(ConfigurationError, match=r"OutboxKit.receive_only\(engine\)"):
        OutboxKit(engine, [])
    with pytest.raises(ConfigurationError, match="a receive-only kit has no outboxes"):
        OutboxKit(engine, [SampleEvent], receive_only=True)



def test_a_worker_process_of_a_receiving_service_campaigns_and_stops_cleanly(database_url, engine, tmp_path):
    environment = {
        **os.environ, "DATABASE_URL": sqlalchemy_url(database_url), "OUTBOXKIT_INBOX_RETENTION_DAYS": "7",
        "OUTBOXKIT_LEADER_TICK_SECONDS": "0.2",
    }
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(worker_command("--scheduler", app=RECEIVE_ONLY_APP), env=environment, stdout=log, stderr=log)
    try:

        def leading() -> bool:
            with engine.connect() as connection:
                return bool(connection.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'outboxkit-leader:%'"
                )).scalar_one())

        wait_until(leading, timeout=60, message="the worker holding the leader's lock")
        wait_until(
            lambda: b"nothing to drain in this process" in (tmp_path / "worker.log").read_bytes(),
            timeout=60, message="the worker started (its signal handlers in place)",
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()


def test_the_cli_says_a_receive_only_kit_has_no_outbox_to_drain(cli):
    code, out, err = cli("worker", "--outbox", "orders")
    assert code != 0 and "only receives" in out + err


def test_the_cli_shows_the_inbox_of_a_receive_only_kit(cli, engine):
    create_applied_table(engine)
    InboxConsumer(engine, source=SOURCE).consume("m-1", lambda session: apply(session, "m-1"))
    code, out, err = cli("inbox", "--json")
    assert code == 0, err
    assert [source["source"] for source in json.loads(out)["sources"]] == [SOURCE]
    code, out, err = cli("status")
    assert code == 0, err
