"""Prometheus metrics (outboxkit.metrics): scraped after real drains against a real receiver.

Real PostgreSQL, the real receiver on 127.0.0.1, the metrics read back the
way Prometheus reads them: over HTTP in the text format, parsed by
prometheus_client's own parser.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, insert, update

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.errors import ConfigurationError
from outboxkit.metrics.prometheus import OutboxMetrics, serve_worker_metrics
from outboxkit.schedules.jobs import JobFailed, every
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.receiver import Reply
from tests.support.worker_app import metrics_port, worker_command

# These tests exercise the elected scheduler's registry through kit.scheduler.add_job, deprecated but kept
# working (tests/integration/test_scheduler_deprecation.py pins its warning).
pytestmark = pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
UTC = timezone.utc
QUIET = {"drain_interval_seconds": 3600, "leader_tick_seconds": 3600, "standby_probe_seconds": 3600, "listen_enabled": False}


def make_kit(engine, **settings) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**{**QUIET, **settings}))


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped[(name, tuple(sorted(labels.items())))]


def insert_rows(engine, url: str, payloads: list[dict], **columns) -> list[int]:
    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": url, "payload": p, **columns} for p in payloads]))


@pytest.fixture
def kit(engine):
    kit = make_kit(engine, outboxes={"sample_events": {"backoff": [3600]}})  # a retry stays in backoff for the test
    yield kit
    kit.close()


def test_the_exporter_scraped_after_a_real_drain_shows_the_attempts_the_gauges_and_the_timings(kit, engine, receiver):
    answers = {"ok": Reply(), "busy": Reply(status=503), "bad": Reply(status=422)}
    receiver.respond = lambda request: answers[request.body["answer"]]
    insert_rows(engine, receiver.url + "/events", [{"answer": a} for a in ("ok", "ok", "busy", "ok", "bad")])
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        server = metrics.serve(0)
        result = kit.drain(SampleEvent)
        metrics.refresh()
        scraped = samples(httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text)

    assert (result.delivered, result.retried, result.stuck) == (3, 1, 1)
    outbox = {"outbox": "sample-events"}
    assert value(scraped, "outboxkit_attempts_total", **outbox, outcome="delivered", status_class="2xx") == 3
    assert value(scraped, "outboxkit_attempts_total", **outbox, outcome="retried", status_class="5xx") == 1
    assert value(scraped, "outboxkit_attempts_total", **outbox, outcome="stuck", status_class="4xx") == 1
    assert value(scraped, "outboxkit_pending_rows", **outbox) == 1  # the 503, in backoff
    assert value(scraped, "outboxkit_stuck_rows", **outbox) == 1
    assert value(scraped, "outboxkit_discarded_rows", **outbox) == 0
    assert value(scraped, "outboxkit_in_flight_rows", **outbox) == 0
    assert value(scraped, "outboxkit_oldest_due_age_seconds", **outbox) == 0  # nothing is due
    assert value(scraped, "outboxkit_send_duration_seconds_count", **outbox) == 5
    assert value(scraped, "outboxkit_delivery_latency_seconds_count", **outbox) == 3
    assert value(scraped, "outboxkit_delivery_latency_seconds_sum", **outbox) > 0
    assert value(scraped, "outboxkit_drain_run_duration_seconds_count", **outbox, kind="call") == 1
    assert value(scraped, "outboxkit_drain_errors_total", **outbox) == 0
    assert value(scraped, "outboxkit_row_gauges_refreshed_timestamp_seconds") > time.time() - 60


def test_the_asgi_app_mounted_in_the_application_serves_the_same_registry(kit, engine, receiver):
    insert_rows(engine, receiver.url + "/events", [{"n": 1}, {"n": 2}])
    app = FastAPI()
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        app.add_route("/metrics", metrics.asgi_app())
        kit.drain(SampleEvent)
        with TestClient(app) as client:
            answer = client.get("/metrics", follow_redirects=False)
    assert answer.status_code == 200  # the exact path, not a 307 to /metrics/
    assert answer.headers["content-type"].startswith("text/plain")
    scraped = samples(answer.text)
    assert value(scraped, "outboxkit_attempts_total", outbox="sample-events", outcome="delivered", status_class="2xx") == 2


def test_a_drain_loop_counts_its_busy_spell_and_the_row_gauges_show_lag_and_leases(engine, clock, receiver):
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**QUIET), clock=clock)
    now = clock.now()
    ids = insert_rows(
        engine, receiver.url + "/events", [{"n": n} for n in range(3)], next_attempt_at=now - timedelta(seconds=120)
    )
    with engine.begin() as connection:  # row 3 is held by a drain: a live lease
        connection.execute(
            update(SampleEvent)
            .where(SampleEvent.id == ids[2])
            .values(claimed_until=now + timedelta(seconds=60), next_attempt_at=now + timedelta(seconds=60))
        )
    try:
        with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
            metrics.refresh()
            before = samples(metrics.render().decode())
            kit.worker.start()
            receiver.wait_for(lambda r: len(r.requests) == 2, timeout=30)
            wait_until(
                lambda: (
                    value(
                        samples(metrics.render().decode()),
                        "outboxkit_drain_run_duration_seconds_count",
                        outbox="sample-events",
                        kind="loop",
                    )
                    == 1
                ),
                timeout=30,
                message="the spell's end",
            )
            kit.worker.stop()
            metrics.refresh()
            after = samples(metrics.render().decode())
    finally:
        kit.close()
    outbox = {"outbox": "sample-events"}
    assert value(before, "outboxkit_pending_rows", **outbox) == 3
    assert value(before, "outboxkit_in_flight_rows", **outbox) == 1
    assert value(before, "outboxkit_oldest_due_age_seconds", **outbox) == pytest.approx(120, abs=1)
    assert value(after, "outboxkit_attempts_total", **outbox, outcome="delivered", status_class="2xx") == 2
    assert value(after, "outboxkit_oldest_due_age_seconds", **outbox) == 0
    assert value(after, "outboxkit_pending_rows", **outbox) == 1


def test_the_leader_gauge_and_the_changes_counter_follow_the_election(kit):
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        scraped = samples(metrics.render().decode())
        assert value(scraped, "outboxkit_leader") == 0
        election = kit.scheduler.elect(leader_tick_seconds=0.1, standby_probe_seconds=0.1)
        wait_until(lambda: election.state.value == "leader", timeout=30, message="leadership")
        leading = samples(metrics.render().decode())
        kit.scheduler.resign()
        resigned = samples(metrics.render().decode())
    assert value(leading, "outboxkit_leader") == 1
    assert value(leading, "outboxkit_leadership_changes_total", change="elected") == 1
    assert value(resigned, "outboxkit_leader") == 0
    assert value(resigned, "outboxkit_leadership_changes_total", change="demoted") == 1


def test_job_runs_are_counted_by_outcome(kit):
    def refuses(context):
        raise JobFailed("receiver is down")

    kit.scheduler.add_job("test.counts", lambda context: {"rows": 1}, every(minutes=1))
    kit.scheduler.add_job("test.refuses", refuses, every(minutes=1))
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        kit.scheduler.run_job("test.counts", scheduled_for=moment)
        kit.scheduler.run_job("test.counts", scheduled_for=moment)  # the same occurrence: the fence skips it
        kit.scheduler.run_job("test.refuses", scheduled_for=moment)
        scraped = samples(metrics.render().decode())
    assert value(scraped, "outboxkit_job_runs_total", job="test.counts", outcome="ok") == 1
    assert value(scraped, "outboxkit_job_runs_total", job="test.counts", outcome="skipped") == 1
    assert value(scraped, "outboxkit_job_runs_total", job="test.refuses", outcome="error") == 1
    assert value(scraped, "outboxkit_job_run_duration_seconds_count", job="test.counts") == 2
    assert time.time() - 600 < value(scraped, "outboxkit_job_last_success_timestamp_seconds", job="test.counts") <= time.time()
    assert ("outboxkit_job_last_success_timestamp_seconds", (("job", "test.refuses"),)) not in scraped  # never succeeded


def test_two_kits_in_one_process_keep_their_own_registries(engine, receiver):
    insert_rows(engine, receiver.url + "/events", [{"n": 1}])
    first, second = make_kit(engine), make_kit(engine)
    try:
        with OutboxMetrics(first, refresh_seconds=3600) as one, OutboxMetrics(second, refresh_seconds=3600) as other:
            first.drain(SampleEvent)
            counted = [
                value(
                    samples(metrics.render().decode()),
                    "outboxkit_attempts_total",
                    outbox="sample-events",
                    outcome="delivered",
                    status_class="2xx",
                )
                for metrics in (one, other)
            ]
    finally:
        first.close()
        second.close()
    assert counted == [1, 0]


def test_a_closed_metrics_object_stops_counting(kit, engine, receiver):
    metrics = OutboxMetrics(kit, refresh_seconds=3600)
    metrics.close()
    insert_rows(engine, receiver.url + "/events", [{"n": 1}])
    assert kit.drain(SampleEvent).delivered == 1
    scraped = samples(metrics.render().decode())
    assert value(scraped, "outboxkit_attempts_total", outbox="sample-events", outcome="delivered", status_class="2xx") == 0
    assert not kit.telemetry.enabled


def test_serve_worker_metrics_serves_while_the_block_runs_and_refuses_a_taken_port(kit):
    with serve_worker_metrics(kit, port=0) as metrics:
        [server] = metrics._servers
        answer = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        assert answer.status_code == 200 and "outboxkit_attempts_total" in answer.text
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics and health checks on 127.0.0.1:{server.port}"):
            metrics.serve(server.port)
    assert not kit.telemetry.enabled  # the block's own OutboxMetrics is closed with it
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
    with serve_worker_metrics(kit, port=None) as nothing:
        assert nothing is None


def test_the_worker_command_serves_metrics_on_its_metrics_port(database_url, engine, receiver):
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "admin")]),
        "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": "3600",
    }
    insert_rows(engine, receiver.url + "/events", [{"n": 1}])
    command = worker_command("--metrics-port", "0")
    process = subprocess.Popen(command, env=environment, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        port = metrics_port(process)
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=30)

        def delivered() -> float:
            scraped = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
            return value(scraped, "outboxkit_attempts_total", outbox="sample-events", outcome="delivered", status_class="2xx")

        wait_until(lambda: delivered() == 1, timeout=30, message="the delivery in the worker's metrics")
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert process.returncode == 0


def test_without_prometheus_client_building_metrics_says_how_to_install_it(kit, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # makes the import fail
    with pytest.raises(ConfigurationError, match=re.escape("pip install 'outboxkit[metrics]'")):
        OutboxMetrics(kit)
    assert not kit.telemetry.enabled


def test_row_gauges_are_nan_until_their_first_read_and_the_refresh_error_counter_is_named_for_promtool():
    # A database that does not answer at start: the refresh thread's reads fail from the first one.
    unreachable = create_engine("postgresql+psycopg://root@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    kit = OutboxKit(unreachable, [SampleEvent], settings=OutboxKitSettings(**QUIET))
    try:
        with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
            wait_until(lambda: metrics.row_refresh_errors._value.get() >= 1, timeout=60, message="a failed refresh")
            scraped = samples(metrics.render().decode())
    finally:
        kit.close()
        unreachable.dispose()
    for name in ("outboxkit_pending_rows", "outboxkit_in_flight_rows", "outboxkit_stuck_rows", "outboxkit_discarded_rows",
                 "outboxkit_oldest_due_age_seconds", "outboxkit_outbox_paused"):
        assert math.isnan(value(scraped, name, outbox="sample-events")), name
    assert value(scraped, "outboxkit_row_refresh_errors_total") >= 1
    assert not [name for name, _ in scraped if "gauge" in name and name.endswith("_total")]


def test_the_worker_port_answers_liveness_readiness_and_metrics_at_their_paths_only(kit):
    from outboxkit.drain.worker import DrainWorker

    worker = DrainWorker(kit)
    with serve_worker_metrics(kit, port=0, readiness=worker.readiness) as metrics:
        [server] = metrics._servers
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{base}/healthz", timeout=10).text == "ok\n"
        not_ready = httpx.get(f"{base}/readyz", timeout=10)
        assert (not_ready.status_code, not_ready.text) == (503, "not ready: the drain loops are not running\n")
        worker.start()
        try:
            ready = httpx.get(f"{base}/readyz", timeout=10)
            assert (ready.status_code, ready.text) == (200, "ready\n")
        finally:
            worker.stop()
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 503
        assert "outboxkit_attempts_total" in httpx.get(f"{base}/metrics", timeout=10).text
        for path in ("/", "/metrics/", "/health", "/healthz/x", "/favicon.ico"):
            answer = httpx.get(base + path, timeout=10)
            assert answer.status_code == 404 and "outboxkit_" not in answer.text, path


def test_a_worker_whose_database_does_not_answer_is_not_ready():
    from sqlalchemy import create_engine

    from outboxkit.drain.worker import DrainWorker

    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nothing", connect_args={"connect_timeout": 5})
    kit = make_kit(unreachable, listen_enabled=False)
    worker = DrainWorker(kit)
    worker.start()
    try:
        reason = worker.readiness()
    finally:
        worker.stop()
        kit.close()
    assert reason is not None and reason.startswith("the database does not answer: OperationalError")


def test_the_paused_gauge_follows_an_operators_pause(kit, engine):
    from outboxkit.storage.pauses import pause, resume

    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        metrics.refresh()
        assert value(samples(metrics.render().decode()), "outboxkit_outbox_paused", outbox="sample-events") == 0
        with engine.begin() as connection:
            pause(connection, "sample-events", actor="test", now=datetime.now(UTC))
        metrics.refresh()
        assert value(samples(metrics.render().decode()), "outboxkit_outbox_paused", outbox="sample-events") == 1
        with engine.begin() as connection:
            resume(connection, "sample-events")
        metrics.refresh()
        assert value(samples(metrics.render().decode()), "outboxkit_outbox_paused", outbox="sample-events") == 0


def test_the_listener_gauge_and_reconnect_counter_follow_its_connection(engine, database_url):
    from tests.support.leadership import terminate_backend

    kit = make_kit(engine, listen_enabled=True)
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        def scraped(name: str) -> float:
            return value(samples(metrics.render().decode()), name)

        kit.worker.start()
        try:
            listener = kit.worker.listener
            assert listener is not None and listener.wait_for_generation(1, timeout=30)
            assert (scraped("outboxkit_listener_connected"), scraped("outboxkit_listener_reconnects_total")) == (1, 0)
            assert listener.backend_pid is not None
            terminate_backend(database_url, listener.backend_pid)
            assert listener.wait_for_generation(2, timeout=60)
            assert (scraped("outboxkit_listener_connected"), scraped("outboxkit_listener_reconnects_total")) == (1, 1)
        finally:
            kit.worker.stop()
        assert scraped("outboxkit_listener_connected") == 0
    kit.close()


def test_dropped_attempt_history_records_are_counted(kit, engine, receiver):
    from sqlalchemy import text

    with engine.begin() as connection:
        connection.execute(text("DROP TABLE outboxkit_attempts"))  # a database without the migration
    insert_rows(engine, receiver.url + "/events", [{"n": 1}, {"n": 2}])
    with OutboxMetrics(kit, refresh_seconds=3600) as metrics:
        assert kit.drain(SampleEvent).delivered == 2  # delivery goes on
        scraped = samples(metrics.render().decode())
    assert value(scraped, "outboxkit_attempt_history_dropped_total", outbox="sample-events") == 2
