"""Schedules as rows in the kit a user gets: the lifespan and ``outboxkit worker`` fire them with no wiring.

Real PostgreSQL, real threads and the system clock (the lifespan's loop runs
on it), a real receiver for the HTTP target, the real CLI in a subprocess.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.errors import ConfigurationError, InvalidScheduleError, LifecycleError, MigrationRequired
from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.jobs import JobContext, every
from outboxkit.schedules.rows import definition_values
from outboxkit.storage.tables import job_runs, schedule_audit, schedules
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent, ScheduledCall
from tests.support.worker_app import SCHEDULES_APP, worker_command

ROOT = Path(__file__).resolve().parents[2]
EVERY_SECOND = ScheduleTrigger.every(seconds=1)
FAR_AWAY = ScheduleTrigger.once(at="2099-01-01T00:00:00+00:00")  # never fires while a test runs
TIMEOUT = 60.0  # seconds; the machine is loaded
# The election and the safety-net drain are an hour away: what fires here is the schedule loop.
QUIET = {"drain_interval_seconds": 3600, "leader_tick_seconds": 3600, "standby_probe_seconds": 3600,
         "url_allow_list": ("127.0.0.1/32",)}  # the receivers listen on 127.0.0.1


def make_kit(engine, **settings) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent, ScheduledCall], settings=OutboxKitSettings(**{**QUIET, **settings}))


def runs(engine, name: str) -> list:
    statement = select(job_runs).where(job_runs.c.job_id == name).order_by(job_runs.c.scheduled_for)
    with engine.connect() as connection:
        return list(connection.execute(statement).mappings())


def schedule_rows(engine) -> dict[str, dict]:
    with engine.connect() as connection:
        return {row["name"]: dict(row) for row in connection.execute(select(schedules)).mappings()}


def record(context: JobContext) -> dict[str, int]:
    return {"ran": 1}


def nothing(context: JobContext) -> None:
    return None


# The threads alive when the test started: a sibling test's schedule threads still ending (an executor that
# the garbage collector has not yet reaped, a run finishing after its kit closed) are not this test's kit.
_threads_before: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _note_threads_before() -> None:
    _threads_before.clear()
    _threads_before.update(threading.enumerate())


def kit_threads() -> list[str]:
    """The threads of this test's schedule loop and runs that are alive now."""
    return [thread.name for thread in threading.enumerate()
            if thread.name.startswith("outboxkit-schedule") and thread not in _threads_before]  # fmt: skip


# -- the lifespan ----------------------------------------------------------------------------


def test_the_lifespan_fires_a_schedule_declared_in_code_and_one_made_at_runtime(engine):
    kit = make_kit(engine, scheduler_enabled=False)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    kit.schedules.register_job("shop.later", record)  # targeted only by a row made at runtime
    app = FastAPI(lifespan=kit.lifespan)
    with TestClient(app):
        wait_until(lambda: kit.schedules.running, timeout=TIMEOUT, message="the loop's start")
        kit.schedules.store.create(
            ScheduleDefinition(name="made-at-runtime", trigger=EVERY_SECOND, target=JobTarget(job="shop.later")),
            actor="alice",
        )
        wait_until(lambda: any(run["outcome"] == "ok" for run in runs(engine, "shop.tick")), timeout=TIMEOUT,
                   message="a run of the declared schedule")
        wait_until(lambda: any(run["outcome"] == "ok" for run in runs(engine, "made-at-runtime")), timeout=TIMEOUT,
                   message="a run of the schedule made at runtime")
    assert not kit.schedules.running
    assert schedule_rows(engine)["shop.tick"]["defined_in"] == "code"
    assert all(run["counts"] == {"ran": 1} for run in runs(engine, "shop.tick") if run["outcome"] == "ok")


def test_the_lifespan_enqueues_a_declared_http_schedule_and_the_drain_delivers_it(engine, receiver):
    kit = make_kit(engine, scheduler_enabled=False)
    kit.schedules.add_http("partner.ping", EVERY_SECOND,
                           HttpTarget(url=receiver.url + "/ping", outbox="scheduled-calls", body={"alive": True}))
    with TestClient(FastAPI(lifespan=kit.lifespan)):
        receiver.wait_for(lambda r: len(r.requests) >= 1, timeout=TIMEOUT)
    request = receiver.requests[0]
    assert (request.method, request.path, request.body) == ("POST", "/ping", {"alive": True})
    assert runs(engine, "partner.ping")[0]["outcome"] == "enqueued"


def test_the_schedules_declared_in_code_are_synced_at_every_start(engine):
    api_row = ScheduleDefinition(name="made-by-alice", trigger=FAR_AWAY, target=JobTarget(job="nightly"))
    before = make_kit(engine, scheduler_enabled=False)
    before.schedules.add_job("nightly", nothing, FAR_AWAY)
    before.schedules.add_job("retired", nothing, FAR_AWAY)
    with TestClient(FastAPI(lifespan=before.lifespan)):
        wait_until(lambda: before.schedules.running, timeout=TIMEOUT, message="the first start")
        before.schedules.store.create(api_row, actor="alice")
    first = schedule_rows(engine)
    assert set(first) == {"nightly", "retired", "made-by-alice"}

    # The next deploy: nightly's trigger changed, retired is gone from the code.
    after = make_kit(engine, scheduler_enabled=False)
    moved = ScheduleTrigger.once(at="2098-06-01T00:00:00+00:00")
    after.schedules.add_job("nightly", nothing, moved)
    with TestClient(FastAPI(lifespan=after.lifespan)):
        wait_until(lambda: after.schedules.running, timeout=TIMEOUT, message="the second start")
        rows = schedule_rows(engine)

    assert set(rows) == {"nightly", "made-by-alice"}
    assert rows["nightly"]["trigger_fields"] == {"at": "2098-06-01T00:00:00+00:00"}
    assert rows["nightly"]["next_run_at"] == moved.first_at_or_after(rows["nightly"]["changed_at"])
    assert rows["made-by-alice"] == first["made-by-alice"]  # made through the API: never touched by the sync
    with engine.connect() as connection:
        audit = connection.execute(
            select(schedule_audit.c.schedule, schedule_audit.c.action, schedule_audit.c.actor, schedule_audit.c.after)
            .where(schedule_audit.c.schedule == "retired").order_by(schedule_audit.c.id)
        ).all()
    assert [(name, action, actor, after is None) for name, action, actor, after in audit] == [
        ("retired", "sync", "code", False), ("retired", "sync", "code", True),
    ]


def test_with_the_setting_off_the_lifespan_neither_syncs_nor_fires(engine, caplog):
    kit = make_kit(engine, scheduler_enabled=False, schedules_enabled=False)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    caplog.set_level(logging.INFO, logger="outboxkit")
    with TestClient(FastAPI(lifespan=kit.lifespan)):
        assert not kit.schedules.running
        assert kit_threads() == []
        assert kit.worker.running  # the rest of the runtime starts as before
    assert schedule_rows(engine) == {}
    assert runs(engine, "shop.tick") == []
    assert [r.event_name for r in caplog.records if r.name == "outboxkit.integration"] == [
        "integration.schedules_disabled", "integration.scheduler_disabled",
    ]


def test_shutdown_stops_the_loop_before_the_kit_closes_and_logs_no_error(engine, caplog):
    entered, gate = threading.Event(), threading.Event()

    def slow(context: JobContext) -> dict[str, int]:
        entered.set()
        gate.wait(TIMEOUT)
        return {"ran": 1}

    kit = make_kit(engine)  # the election too: the whole shutdown order
    kit.schedules.add_job("shop.slow", slow, EVERY_SECOND)
    caplog.set_level(logging.INFO, logger="outboxkit")
    with TestClient(FastAPI(lifespan=kit.lifespan)):
        assert entered.wait(TIMEOUT), "the slow job never started"
        gate.set()  # it finishes while the lifespan shuts down, or just before
    assert kit_threads() == []  # no loop and no run thread left: nothing can fire after close
    history = runs(engine, "shop.slow")
    assert history and {run["outcome"] for run in history} <= {"ok", "missed"}  # none left running
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_schedule_leases")).scalar_one() == 0
    stopped = [r.getMessage() for r in caplog.records if getattr(r, "event_name", None) == "schedule.runner_stopped"]
    assert stopped == ["stopped firing schedule rows"]
    schedule_loggers = ("outboxkit.schedules.", "outboxkit.integration", "outboxkit.storage.notify")
    problems = [r for r in caplog.records
                if r.levelno >= logging.ERROR or (r.name.startswith(schedule_loggers) and r.levelno >= logging.WARNING)]
    assert problems == [], [r.getMessage() for r in problems]


def test_a_declared_schedule_records_where_the_code_declares_it(engine):
    kit = make_kit(engine, scheduler_enabled=False)
    declared_on = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    kit.schedules.sync()
    assert kit.schedules.store.get("shop.tick").declared_at == f"{__name__}:{declared_on}"


def test_a_database_without_the_run_now_column_is_refused_naming_the_migration(engine):
    with engine.begin() as connection:  # as a database whose kit migration is at outboxkit_0009
        connection.execute(text("ALTER TABLE outboxkit_schedules DROP COLUMN run_now_pending"))
    kit = make_kit(engine, scheduler_enabled=False)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    with pytest.raises(MigrationRequired, match="outboxkit_0010 .*run_now_pending missing"):
        kit.schedules.start()
    assert not kit.schedules.running


def test_a_database_behind_the_schedule_migration_is_said_in_one_line_and_the_rest_starts(engine, receiver, caplog):
    with engine.begin() as connection:  # as a database whose kit migration is at outboxkit_0005
        connection.execute(text("DROP TABLE outboxkit_schedule_leases, outboxkit_schedule_audit, outboxkit_schedules"))
    kit = make_kit(engine, scheduler_enabled=False)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    caplog.set_level(logging.INFO, logger="outboxkit")

    with pytest.raises(MigrationRequired, match="outboxkit_0010 .*OUTBOXKIT_SCHEDULES_ENABLED=false"):
        kit.schedules.start()
    assert not kit.schedules.running and kit_threads() == []
    caplog.clear()

    with TestClient(FastAPI(lifespan=kit.lifespan)):
        wait_until(lambda: any(r.levelno >= logging.ERROR for r in caplog.records), timeout=TIMEOUT,
                   message="the line that says the migration is missing")
        assert kit.worker.running and not kit.schedules.running
        with engine.begin() as connection:
            connection.execute(SampleEvent.__table__.insert().values(target_url=receiver.url + "/e", payload={}))
        receiver.wait_for(lambda r: len(r.requests) == 1, timeout=TIMEOUT)  # the drain is not held up
    assert kit_threads() == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.event_name for r in errors] == ["schedule.needs_migration"]
    message = errors[0].getMessage()
    assert "outboxkit_0010" in message and "alembic upgrade heads" in message and "goes on without it" in message
    assert errors[0].exc_info is None  # one line, no traceback


def test_processes_that_start_together_sync_a_new_schedule_once_and_all_start(engine):
    # Another process's start inserted the new schedule and has not committed yet: this start's
    # insert waits on the unique name, and must then take that row as its own, not fail.
    other = make_kit(engine, scheduler_enabled=False)
    other.schedules.add_job("shop.nightly", nothing, FAR_AWAY)
    [definition] = other.schedules.definitions
    now = other.clock.now()
    values = {**definition_values(definition), "next_run_at": FAR_AWAY.first_at_or_after(now), "defined_in": "code",
              "created_at": now, "created_by": "code", "changed_at": now, "changed_by": "code"}
    kit = make_kit(engine, scheduler_enabled=False)
    kit.schedules.add_job("shop.nightly", nothing, FAR_AWAY)
    started: list[BaseException | None] = []

    def start() -> None:
        try:
            kit.schedules.start()
            started.append(None)
        except BaseException as exc:
            started.append(exc)

    with engine.connect() as holder:
        transaction = holder.begin()
        holder.execute(schedules.insert().values(values))
        thread = threading.Thread(target=start)
        thread.start()
        wait_until(lambda: waiting_on_a_lock(engine), timeout=TIMEOUT, message="the second insert waiting")
        transaction.commit()
    thread.join(TIMEOUT)
    try:
        assert started == [None] and kit.schedules.running
        assert list(schedule_rows(engine)) == ["shop.nightly"]
    finally:
        kit.close()
        other.close()


def waiting_on_a_lock(engine) -> bool:
    with engine.connect() as connection:
        statement = text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        return connection.execute(statement).scalar_one() > 0


def test_a_database_that_does_not_answer_at_start_holds_up_nothing_and_the_loop_starts_once_it_does(engine, caplog):
    kit_engine = create_engine(engine.url)  # a pool of its own, with no connection open yet
    kit = make_kit(kit_engine, scheduler_enabled=False, drain_enabled=False)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    app = FastAPI(lifespan=kit.lifespan)
    caplog.set_level(logging.INFO, logger="outboxkit")
    refuse_connections(engine, True)
    try:
        with TestClient(app):  # the lifespan's start-up returns although the database refuses
            wait_until(lambda: retrying(caplog), timeout=TIMEOUT, message="the start's retry warning")
        assert kit_threads() == [] and not kit.schedules.running  # the shutdown cancelled the start
        caplog.clear()
        with TestClient(app):
            wait_until(lambda: retrying(caplog), timeout=TIMEOUT, message="the start's retry warning")
            refuse_connections(engine, False)
            wait_until(lambda: any(run["outcome"] == "ok" for run in runs(engine, "shop.tick")), timeout=TIMEOUT,
                       message="a run once the database answers")
    finally:
        refuse_connections(engine, False)
        kit_engine.dispose()
    assert [r.event_name for r in caplog.records if r.levelno >= logging.WARNING] == ["schedule.start_retrying"]


def refuse_connections(engine, refuse: bool) -> None:
    """New connections to the test's database are refused (existing ones, like the engine's, go on)."""
    maintenance = create_engine(engine.url.set(database="postgres"), poolclass=NullPool)
    with maintenance.connect() as connection:
        connection.exec_driver_sql(
            f'ALTER DATABASE "{engine.url.database}" ALLOW_CONNECTIONS {"false" if refuse else "true"}'
        )
        connection.commit()


def retrying(caplog) -> bool:
    return any(getattr(r, "event_name", None) == "schedule.start_retrying" for r in caplog.records)


# -- one loop per process; names ------------------------------------------------------------


def test_a_second_start_is_refused_and_a_stopped_loop_starts_again(engine):
    kit = make_kit(engine)
    kit.schedules.add_job("shop.tick", record, EVERY_SECOND)
    try:
        kit.schedules.start()
        with pytest.raises(LifecycleError, match="schedule loop is running in this process"):
            kit.schedules.start()
        with pytest.raises(LifecycleError, match="declare schedules before the kit starts"):
            kit.schedules.add_job("shop.other", record, EVERY_SECOND)
        kit.schedules.stop()
        kit.schedules.stop()  # idempotent
        kit.schedules.start()
        wait_until(lambda: any(run["outcome"] == "ok" for run in runs(engine, "shop.tick")), timeout=TIMEOUT,
                   message="a run after the restart")
    finally:
        kit.close()
    assert not kit.schedules.running and kit_threads() == []


@pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")
def test_names_collide_with_neither_the_elected_jobs_nor_the_kits_own(engine):
    kit = make_kit(engine)
    kit.scheduler.add_job("billing.expire", nothing, every(minutes=5))
    with pytest.raises(ConfigurationError, match="the elected scheduler has a job with this id"):
        kit.schedules.add_job("billing.expire", nothing, EVERY_SECOND)
    kit.schedules.add_job("billing.report", nothing, EVERY_SECOND)
    with pytest.raises(ConfigurationError, match="name of a schedule declared with kit.schedules"):
        kit.scheduler.add_job("billing.report", nothing, every(minutes=5))
    with pytest.raises(ConfigurationError, match="declared twice"):
        kit.schedules.add_http("billing.report", EVERY_SECOND, HttpTarget(url="http://127.0.0.1/x", outbox="scheduled-calls"))
    with pytest.raises(ConfigurationError, match="kit's own"):
        kit.schedules.add_job("outboxkit.drain.sample-events", nothing, EVERY_SECOND)
    with pytest.raises(InvalidScheduleError, match="^name: .*the elected scheduler has a job with this id"):
        kit.schedules.store.create(  # a schedule made at runtime is refused the same way
            ScheduleDefinition(name="billing.expire", trigger=EVERY_SECOND, target=JobTarget(job="billing.report")),
            actor="alice",
        )
    assert schedule_rows(engine) == {}
    assert [definition.name for definition in kit.schedules.definitions] == ["billing.report"]
    assert [job.id for job in kit.scheduler.jobs() if not job.id.startswith("outboxkit.")] == ["billing.expire"]
    kit.close()


# -- outboxkit worker ----------------------------------------------------------------------------


def start_worker(database_url: str, **variables: str) -> subprocess.Popen:
    """``outboxkit worker`` on the kit of ``SCHEDULES_APP`` (one schedule declared in code), stderr piped."""
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "admin")]),
        "OUTBOXKIT_DRAIN_INTERVAL_SECONDS": "3600",
        **variables,
    }
    command = worker_command(app=SCHEDULES_APP)
    return subprocess.Popen(command, env=environment, cwd=ROOT, stderr=subprocess.PIPE, text=True)


def stop_worker(process: subprocess.Popen, read: str = "") -> str:
    """SIGTERM, wait for the exit; everything it wrote on stderr (after ``read``, what was read already)."""
    try:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return read + rest


def test_the_worker_command_fires_a_declared_schedule_and_stops_cleanly(database_url, engine):
    process = start_worker(database_url)
    try:
        wait_until(lambda: any(run["outcome"] == "ok" for run in runs(engine, "worker.tick")) or process.poll() is not None,
                   timeout=TIMEOUT, message="a run fired by the worker")
    finally:
        errors = stop_worker(process)
    assert process.returncode == 0, errors
    fired = [run for run in runs(engine, "worker.tick") if run["outcome"] == "ok"]
    assert fired and {run["counts"]["pid"] for run in fired} == {process.pid}  # looked up by name in the worker
    assert "firing schedule rows in this process (1 declared in code" in errors
    assert "stopped firing schedule rows" in errors
    assert " ERROR " not in errors and "Traceback" not in errors, errors


def test_the_worker_command_with_the_setting_off_fires_nothing(database_url, engine):
    process = start_worker(database_url, OUTBOXKIT_SCHEDULES_ENABLED="false")
    lines: list[str] = []
    try:
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "draining" in line:  # started: the schedule loop's decision was made before
                break
    finally:
        errors = stop_worker(process, "".join(lines))
    assert process.returncode == 0, errors
    assert "OUTBOXKIT_SCHEDULES_ENABLED=false" in errors and "firing schedule rows" not in errors
    assert schedule_rows(engine) == {} and runs(engine, "worker.tick") == []
