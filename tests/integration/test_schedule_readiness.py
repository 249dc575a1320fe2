"""``/readyz`` reports the schedule loop, against the real database: a process that should fire schedule rows
and does not is "not ready", with the reason, as a process whose drain loop stopped.

The loop crashed (its thread died), its runner stopped, the kit's loop stopped, the loop still starting
while the database does not answer, the schedule tables missing (through ``outboxkit worker
--metrics-port``), and a process with ``OUTBOXKIT_SCHEDULES_ENABLED=false``, which is not asked about it.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.integration import readiness, readiness_app
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.worker_app import SCHEDULES_APP, metrics_port, worker_command

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"drain_interval_seconds": 3600, "leader_tick_seconds": 3600, "standby_probe_seconds": 3600,
         "scheduler_enabled": False, "listen_enabled": False}


class LoopCrash(BaseException):
    """What no turn of the loop handles (its handler takes ``Exception``): the loop's thread ends."""


def make_kit(engine, **settings) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(**{**QUIET, **settings}))


def probe(client: TestClient) -> tuple[int, str]:
    answer = client.get("/readyz")
    return answer.status_code, answer.text


def test_the_apps_readiness_reports_a_crashed_schedule_loop(engine, caplog):
    kit = make_kit(engine)
    app = FastAPI(lifespan=kit.lifespan)
    app.add_route("/readyz", readiness_app(kit))
    try:
        with TestClient(app) as client:
            wait_until(lambda: probe(client) == (200, "ready\n"), timeout=30, message="ready once the schedules synced")
            runner = kit.schedules.runner
            assert runner.loop_alive

            def crash() -> None:
                raise LoopCrash("a fault no turn handles")

            runner.fire_due = crash  # type: ignore[method-assign]
            with caplog.at_level(logging.ERROR, logger="outboxkit.schedules.runner"):
                runner.wake()
                wait_until(lambda: not runner.loop_alive, timeout=30, message="the loop's thread ends")
            assert probe(client) == (503, "not ready: the schedule loop has stopped\n")
            assert kit.worker.readiness() is None  # the drains are fine: the schedule loop alone is reported
            assert any(record.message.startswith("the schedule loop died") for record in caplog.records)
    finally:
        kit.close()


def test_a_stopped_runner_and_a_stopped_loop_are_reported(engine):
    kit = make_kit(engine, drain_enabled=False)
    try:
        assert readiness(kit) == "the schedule loop is not running"  # never started
        kit.schedules.start()
        assert readiness(kit) is None
        kit.schedules.runner.stop()  # the runner under the kit stops: the kit still thinks it runs
        assert readiness(kit) == "the schedule loop has stopped"
        kit.schedules.stop()
        assert readiness(kit) == "the schedule loop is not running"
        kit.schedules.start()  # started again (a second TestClient(app)): ready again
        assert readiness(kit) is None
    finally:
        kit.schedules.stop()
        kit.close()


def test_a_process_that_fires_no_schedule_rows_is_not_asked_about_the_loop(engine):
    kit = make_kit(engine, drain_enabled=False, schedules_enabled=False)
    try:
        assert kit.schedules.readiness() == "the schedule loop is not running"
        assert readiness(kit) is None
    finally:
        kit.close()


def test_a_loop_still_starting_says_why_it_waits():
    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nothing", connect_args={"connect_timeout": 5})
    kit = make_kit(unreachable, drain_enabled=False)
    try:
        kit.schedules.start_in_background(retry_seconds=3600)  # one attempt, then it waits
        wait_until(lambda: "failed" in (kit.schedules.readiness() or ""), timeout=30, message="the first attempt fails")
        reason = kit.schedules.readiness() or ""
        assert reason.startswith("the schedule loop is starting (the last attempt failed: OperationalError"), reason
        assert readiness(kit, drains=lambda: None) == reason
    finally:
        kit.schedules.stop()
        kit.close()
        unreachable.dispose()
    assert kit.schedules.readiness() == "the schedule loop is not running"


def test_the_worker_port_reports_a_schedule_loop_that_did_not_start(database_url, engine):
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "admin")]),
        "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": "3600",
    }

    def readyz_of_a_worker(expected: tuple[int, str]) -> None:
        process = subprocess.Popen(worker_command("--metrics-port", "0", app=SCHEDULES_APP), env=environment, cwd=ROOT,
                                   stderr=subprocess.PIPE, text=True)
        try:
            port = metrics_port(process)

            def answer() -> tuple[int, str]:
                reply = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
                return reply.status_code, reply.text

            wait_until(lambda: answer() == expected, timeout=60, message=f"/readyz answers {expected}")
        finally:
            process.terminate()
            process.communicate(timeout=60)
        assert process.returncode == 0

    readyz_of_a_worker((200, "ready\n"))
    with engine.begin() as connection:  # a database behind the kit's migration: no schedule tables
        connection.execute(text("DROP TABLE outboxkit_schedule_leases"))
    readyz_of_a_worker((503, "not ready: the schedule loop did not start: schedules as rows need the kit's migration "
                             "outboxkit_0010 (outboxkit_schedule_leases missing): run `alembic upgrade heads` with "
                             "outboxkit:migrations/versions in version_locations, or set "
                             "OUTBOXKIT_SCHEDULES_ENABLED=false to run without them\n"))
