"""Schedules: the database server restarted (immediate stop) while claims are in flight; the runners recover.

The test runs its own PostgreSQL cluster (``tests/faults/private_server.py``;
the shared server is never touched).  Three ``schedule_worker`` processes
fire ten schedules of one second (grace 60 s, runs of 0.05 s, a 6 s lease;
each process holds four runs at most, so each one awake claims its share at
a fire time), through two restarts (six in the long variant, ``pytest -m
slow``).
Fire times fall on whole seconds, when every runner wakes and claims; each
restart is timed a few milliseconds past one (``pg_ctl stop -m immediate``:
every server process quits at once without a checkpoint, the clients'
sessions and transactions die mid-claim, mid-run or mid-record; ``start``
then runs crash recovery).

After each restart every process fires again by itself (no process is
restarted; each one's loop retries and its pool reconnects).  At the end
(``ScheduleLedger``): no occurrence ran twice; none is recorded ``missed``
and every fire time ran or coalesced into a later run within the grace; no
run started before its fire time; no schedule's runs overlapped; no run is
left ``running`` once the runners have swept the runs a restart interrupted
(a claim committed as the server went down: its runner never started it, and
its lease expires into ``abandoned``); and every process logged the failure it recovered from
(a failed turn of its loop, or the loss of its LISTEN session).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text

from tests.faults.fleet import WorkerFleet
from tests.faults.private_server import PrivateServer
from tests.faults.scenario import LONG_VARIANT
from tests.faults.schedule_ledger import ScheduleLedger, install_schedules
from tests.faults.schedule_worker import schedule_worker_command
from tests.support.database import sqlalchemy_url

pytestmark = pytest.mark.timeout(600)

PERIOD, GRACE, SCHEDULES, LEASE = 1.0, 60.0, 10, 6.0
WORKERS = ["schedules-1", "schedules-2", "schedules-3"]
# Seconds after a fire time, in turn per restart: the runners are claiming.
PAST_THE_SECOND = [0.002, 0.015, 0.030, 0.008, 0.022, 0.004]
RESTARTS = [pytest.param(2, id="ci"), pytest.param(len(PAST_THE_SECOND), id="long", marks=LONG_VARIANT)]


def database_now(database_url: str) -> datetime:
    with psycopg.connect(database_url) as connection:
        (moment,) = connection.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
        return moment


def runs_still_running(engine: Engine, *, started_before: datetime) -> list[tuple[str, datetime]]:
    """Runs still recorded ``running`` that started before ``started_before`` (the server's clock)."""
    with engine.connect() as connection:
        return [(name, at) for name, at in connection.execute(
            text("SELECT job_id, scheduled_for FROM outboxkit_job_runs WHERE outcome = 'running' "
                 "AND started_at < :started_before"),
            {"started_before": started_before},
        )]  # fmt: skip


@pytest.mark.parametrize("restarts", RESTARTS)
def test_schedule_runners_recover_from_database_restarts_mid_claim_and_fire_each_occurrence_once(
    private_server: PrivateServer, tmp_path, restarts: int
) -> None:
    database_url = private_server.database_url("crash")
    engine = create_engine(sqlalchemy_url(database_url), pool_size=2, max_overflow=2, pool_pre_ping=True)
    names = install_schedules(engine, count=SCHEDULES, period=PERIOD, grace=GRACE)
    command = schedule_worker_command(sqlalchemy_url(database_url), lease=LEASE, job_seconds=0.05, max_workers=4)

    def fired_since(worker: str, since) -> bool:
        return any(run.holder.startswith(worker + ":") and run.started_at >= since
                   for run in ScheduleLedger.read(engine).runs)  # fmt: skip

    def wait_until(condition, what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except Exception:  # the server is still starting
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout:g}s: {what} (worker logs in {tmp_path})")
            time.sleep(0.1)

    try:
        with WorkerFleet(command, log_dir=tmp_path / "logs") as fleet:
            fleet.start(WORKERS)
            start = database_now(database_url)
            for worker in WORKERS:
                wait_until(lambda worker=worker: fired_since(worker, start), f"{worker} firing")
            for offset in PAST_THE_SECOND[:restarts]:
                time.sleep(1 - time.time() % 1 + offset)  # just past a fire time (the hosts' clocks agree)
                private_server.stop_immediately()
                private_server.start()
                restarted = database_now(database_url)
                for worker in WORKERS:  # each recovers by itself
                    wait_until(lambda worker=worker, restarted=restarted: fired_since(worker, restarted),
                               f"{worker} firing after the restart")
            # A run whose claim committed as the server went down is one its runner never started (to it, the
            # claim failed): it stays 'running' until its lease (6 s) expires and a runner's sweep records it
            # abandoned.  The processes keep running until every run that started before the last restart is
            # recorded; runs started since take 0.05 s.  (Waiting only for runs older than the lease let the fleet
            # stop a second or two after the last restart, with its interrupted runs not yet swept.)
            wait_until(lambda: not runs_still_running(engine, started_before=restarted), "every interrupted run swept")
            end = database_now(database_url) - timedelta(seconds=3)
        deaths = fleet.deaths()
        # What each process logged of the restarts: its loop's failed turn (a restart that caught it in a
        # transaction) or its LISTEN session's loss (every restart ends that session, whatever the loop was doing).
        failures = {worker: sum(event["event_name"] in {"schedule.loop_failed", "notify.connection_lost"}
                                for event in fleet.events("log", name=worker))
                    for worker in WORKERS}  # fmt: skip
        ledger = ScheduleLedger.read(engine)
    finally:
        engine.dispose()

    assert deaths == [], f"a process died: {deaths}"
    assert all(failures.values()), f"a process never saw the restarts: {failures}"
    assert ledger.duplicates() == [], f"occurrences run twice: {ledger.duplicates()[:5]}"
    outcomes = ledger.outcomes()
    assert outcomes["missed"] == 0 and outcomes["running"] == 0, outcomes
    lost = {name: ledger.uncovered(name, period=PERIOD, grace=GRACE, start=start, end=end) for name in names}
    assert not any(lost.values()), f"occurrences lost: {lost}"
    assert ledger.early() == [], f"runs started before their fire time: {ledger.early()[:5]}"
    assert ledger.overlaps() == [], f"runs overlapping: {ledger.overlaps()[:3]}"
    print(f"database restart: {restarts} restarts, {len(ledger.runs)} runs, outcomes {dict(outcomes)}, "
          f"loop failures per process {failures}")
