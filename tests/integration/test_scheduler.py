"""The scheduler: drain jobs, the application's job registry, the fence and the job discipline."""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings
from outboxkit.schedules import ScheduleTrigger
from outboxkit.schedules.jobs import INTERVAL_ANCHOR, JobFailed, calendar_interval, cron, every, once
from outboxkit.storage.tables import job_runs
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent

# These tests exercise the elected scheduler's registry through kit.scheduler.add_job, deprecated but kept
# working (tests/integration/test_scheduler_deprecation.py pins its warning).
pytestmark = pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")

UTC = timezone.utc
QUIET = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False, job_history_limit=10)


@pytest.fixture
def kit(engine):
    kit = OutboxKit(engine, [SampleEvent], settings=QUIET)
    yield kit
    kit.close()


def runs(engine, job_id: str) -> list[dict]:
    with engine.connect() as connection:
        rows = connection.execute(select(job_runs).where(job_runs.c.job_id == job_id).order_by(job_runs.c.id))
        return [dict(row._mapping) for row in rows]


def test_each_outbox_gets_a_drain_job_with_a_stable_id_and_name(engine):
    with OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(drain_interval_seconds=60)) as kit:
        [info] = kit.scheduler.jobs()
        assert (info.id, info.name) == ("outboxkit.drain.sample-events", "sample-events")
        assert info.trigger == "interval[0:01:00]"
        assert info.next_run_at is not None


def test_drain_job_delivers_due_rows_and_records_its_run(engine, receiver, kit):
    with engine.begin() as connection:
        connection.execute(
            SampleEvent.__table__.insert(), [{"target_url": receiver.url, "payload": {"n": n}} for n in range(3)]
        )
    record = kit.scheduler.run_job("outboxkit.drain.sample-events", scheduled_for=datetime(2030, 1, 1, tzinfo=UTC))
    assert record.outcome == "ok"
    assert record.counts["delivered"] == 3
    [run] = runs(engine, "outboxkit.drain.sample-events")
    assert (run["job_name"], run["outcome"], run["counts"]["delivered"]) == ("sample-events", "ok", 3)
    assert run["finished_at"] >= run["started_at"]
    assert run["leader"].endswith("(unelected)")


def test_fence_lets_two_schedulers_firing_one_occurrence_run_it_once(engine, caplog):
    calls: list[datetime] = []
    fire_at = datetime.now(UTC) + timedelta(seconds=1)
    kits = [OutboxKit(engine, [SampleEvent], settings=QUIET) for _ in range(2)]
    try:
        for kit in kits:
            kit.scheduler.add_job("test.once", lambda context: calls.append(context.scheduled_for), once(fire_at))
        with caplog.at_level(logging.INFO, logger="outboxkit"):
            for kit in kits:  # forced: both start without an election, as two would-be leaders
                kit.scheduler.start()
            wait_until(lambda: "already taken" in caplog.text, message="the second scheduler's attempt")
            wait_until(lambda: runs(engine, "test.once")[0]["outcome"] == "ok", message="the first run finishing")
        assert calls == [fire_at]
        [run] = runs(engine, "test.once")
        assert (run["scheduled_for"], run["outcome"]) == (fire_at, "ok")
        assert all(kit.scheduler.running for kit in kits)
    finally:
        for kit in kits:
            kit.close()


def test_job_that_raises_leaves_the_scheduler_running_and_its_session_closed(engine, kit):
    sessions = []

    def broken(context):
        sessions.append((context.session, context.session.connection()))
        raise RuntimeError("boom")

    kit.scheduler.add_job("test.broken", broken, every(seconds=0.05))
    kit.scheduler.start()
    wait_until(lambda: len(runs(engine, "test.broken")) >= 2, message="two runs")
    assert kit.scheduler.running
    finished = [run for run in runs(engine, "test.broken") if run["finished_at"] is not None]
    assert finished and all(run["outcome"] == "error" for run in finished)
    assert finished[0]["error"] == "RuntimeError: boom"
    session, connection = sessions[0]
    assert connection.closed and not session.in_transaction()


def test_job_failed_and_bad_return_values_are_recorded_as_errors(kit, engine):
    def refuses(context):
        raise JobFailed("receiver is down")

    kit.scheduler.add_job("test.refuses", refuses, every(minutes=1))
    kit.scheduler.add_job("test.odd", lambda context: {"rows": "many"}, every(minutes=1))
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    assert kit.scheduler.run_job("test.refuses", scheduled_for=moment).error == "receiver is down"
    assert kit.scheduler.run_job("test.odd", scheduled_for=moment).outcome == "error"
    assert [run["outcome"] for run in runs(engine, "test.odd")] == ["error"]


def test_a_job_that_returns_keeps_its_writes_and_one_that_raises_keeps_none(kit, engine):
    # The runner commits context.session when the job returns and rolls it back when it raises, for the
    # elected scheduler and for schedules as rows alike (they share the run discipline).
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE job_marks (name text)"))

    def mark(name: str, *, commit: bool = False, fail: bool = False):
        def job(context):
            context.session.execute(text("INSERT INTO job_marks VALUES (:name)"), {"name": name})
            if commit:
                context.session.commit()
            if fail:
                raise RuntimeError("after writing")
            return {"marked": 1}

        return job

    kit.scheduler.add_job("test.commits", mark("committed", commit=True), every(minutes=1))
    kit.scheduler.add_job("test.returns", mark("returned"), every(minutes=1))
    kit.scheduler.add_job("test.raises", mark("raised", fail=True), every(minutes=1))
    kit.schedules.add_job("rows-returns", mark("row schedule returned"), ScheduleTrigger.every(minutes=1))
    kit.schedules.add_job("rows-raises", mark("row schedule raised", fail=True), ScheduleTrigger.every(minutes=1))
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    outcomes = [kit.scheduler.run_job(job_id, scheduled_for=moment).outcome
                for job_id in ("test.commits", "test.returns", "test.raises")]
    outcomes += [kit.schedules.run_job(name, scheduled_for=moment).outcome for name in ("rows-returns", "rows-raises")]

    assert outcomes == ["ok", "ok", "error", "ok", "error"]
    with engine.connect() as connection:
        kept = sorted(connection.execute(text("SELECT name FROM job_marks")).scalars().all())
    assert kept == ["committed", "returned", "row schedule returned"]


def test_async_job_runs_on_its_own_event_loop(kit, engine):
    async def count_rows(context):
        await asyncio.sleep(0)
        return {"loops": 1, "on_main_loop": int(asyncio.get_running_loop() is main_loop)}

    main_loop = asyncio.new_event_loop()
    try:
        kit.scheduler.add_job("test.async", count_rows, every(minutes=1))
        record = kit.scheduler.run_job("test.async", scheduled_for=datetime(2030, 1, 1, tzinfo=UTC))
    finally:
        main_loop.close()
    assert (record.outcome, record.counts) == ("ok", {"loops": 1, "on_main_loop": 0})


def test_history_is_trimmed_to_the_limit_per_job(kit, engine):
    kit.scheduler.add_job("test.counter", lambda context: {"ticks": 1}, every(minutes=1))
    kit.scheduler.add_job("test.other", lambda context: None, every(minutes=1))
    start = datetime(2030, 1, 1, tzinfo=UTC)
    kit.scheduler.run_job("test.other", scheduled_for=start)
    for minute in range(15):
        kit.scheduler.run_job("test.counter", scheduled_for=start + timedelta(minutes=minute))
    kept = runs(engine, "test.counter")
    assert len(kept) == QUIET.job_history_limit
    assert kept[-1]["scheduled_for"] == start + timedelta(minutes=14)
    assert len(runs(engine, "test.other")) == 1


def test_history_trim_keeps_a_run_still_in_progress(kit, engine):
    kit.scheduler.add_job("test.counter", lambda context: {"ticks": 1}, every(minutes=1))
    start = datetime(2030, 1, 1, tzinfo=UTC)
    with engine.begin() as connection:  # another scheduler's run of 00:00, still going (its fence)
        connection.execute(job_runs.insert().values(
            job_id="test.counter", job_name="test.counter", scheduled_for=start, outcome="running",
            started_at=datetime.now(UTC) - timedelta(hours=1), leader="other:1"))
    for minute in range(1, 15):
        kit.scheduler.run_job("test.counter", scheduled_for=start + timedelta(minutes=minute))
    kept = runs(engine, "test.counter")
    assert kept[0]["scheduled_for"] == start and kept[0]["outcome"] == "running"
    assert len([run for run in kept if run["outcome"] != "running"]) == QUIET.job_history_limit


def test_registry_accepts_each_trigger_kind_and_lists_next_runs(kit):
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    kit.scheduler.add_job("test.cron", lambda context: None, cron(timezone="Europe/Berlin", hour=3, minute=30))
    kit.scheduler.add_job("test.interval", lambda context: None, every(minutes=5), name="five minutes")
    kit.scheduler.add_job("test.monthly", lambda context: None, calendar_interval(timezone="UTC", months=1, hour=6))
    kit.scheduler.add_job("test.once", lambda context: None, once(tomorrow))
    kit.scheduler.add_job("test.once", lambda context: None, once(tomorrow + timedelta(hours=1)))  # replaces
    infos = {info.id: info for info in kit.scheduler.jobs()}
    assert set(infos) == {"outboxkit.drain.sample-events", "test.cron", "test.interval", "test.monthly", "test.once"}
    assert infos["test.interval"].name == "five minutes"
    assert infos["test.once"].next_run_at == tomorrow + timedelta(hours=1)
    assert infos["test.cron"].next_run_at.astimezone(cron_zone()).strftime("%H:%M") == "03:30"
    kit.scheduler.start()
    live = {info.id: info for info in kit.scheduler.jobs()}
    assert live["test.once"].next_run_at == tomorrow + timedelta(hours=1)
    kit.scheduler.remove_job("test.once")
    assert "test.once" not in {info.id for info in kit.scheduler.jobs()}


def cron_zone():
    from zoneinfo import ZoneInfo

    return ZoneInfo("Europe/Berlin")


def test_bad_job_registrations_are_refused_and_change_nothing(kit):
    before = kit.scheduler.jobs()
    with pytest.raises(ConfigurationError, match="reserved"):
        kit.scheduler.add_job("outboxkit.drain.mine", lambda context: None, every(minutes=1))
    with pytest.raises(ConfigurationError, match="reserved"):
        kit.scheduler.add_job("outboxkit.retention.mine", lambda context: None, every(minutes=1))
    with pytest.raises(ConfigurationError, match="job id"):
        kit.scheduler.add_job("bad id!", lambda context: None, every(minutes=1))
    with pytest.raises(ConfigurationError, match="trigger"):
        kit.scheduler.add_job("test.no-trigger", lambda context: None, "every minute")
    with pytest.raises(ConfigurationError, match="cannot be removed"):
        kit.scheduler.remove_job("outboxkit.drain.sample-events")
    with pytest.raises(LookupError):
        kit.scheduler.remove_job("test.never-added")
    assert kit.scheduler.jobs() == before


def test_scheduler_restarts_with_a_fresh_apscheduler_after_a_stop(kit, engine):
    calls = []
    kit.scheduler.add_job("test.tick", lambda context: calls.append(1), every(seconds=0.05))
    kit.scheduler.start()
    wait_until(lambda: calls, message="a first run")
    kit.scheduler.shutdown(wait=False)
    assert not kit.scheduler.running
    count = len(calls)
    kit.scheduler.start()
    wait_until(lambda: len(calls) > count, message="a run after the restart")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_job_runs WHERE outcome = 'running'")).scalar() <= 1


def test_lock_dsn_defaults_to_the_engine_and_accepts_a_sqlalchemy_style_url(engine):
    with OutboxKit(engine, [SampleEvent], settings=QUIET) as kit:
        lock_url = make_url(kit.scheduler.lock_dsn)
        # The engine's own server and database, whatever else its URL carries (the embedded server's
        # URL ends in ?host=<socket folder>).
        assert lock_url.drivername == "postgresql"
        assert lock_url.database == engine.url.database
        assert lock_url.host == engine.url.host and lock_url.query == engine.url.query
    direct = OutboxKitSettings(lock_database_url="postgresql+psycopg://app@db-primary:5432/app")
    with OutboxKit(engine, [SampleEvent], settings=direct) as kit:
        assert kit.scheduler.lock_dsn == "postgresql://app@db-primary:5432/app"


# -- what a job function must look like, checked at add_job --------------------


class CountingJob:
    def __call__(self, context):
        return {"calls": 1}


def job_with_options(context, *, limit=10):
    return None


async def async_job(context):
    return None


def partial_target(table, context):
    return None


@pytest.mark.parametrize(
    "function",
    [lambda context: None, async_job, job_with_options, CountingJob(), functools.partial(partial_target, "grants"), print],
    ids=["lambda", "async", "keyword-options", "callable-object", "partial", "builtin"],
)
def test_add_job_accepts_any_function_callable_with_one_job_context(kit, function):
    assert kit.scheduler.add_job("test.fine", function, every(minutes=1)).function is function


def no_arguments():
    return None


def two_arguments(context, session):
    return None


def keyword_only(*, context):
    return None


def generator_job(context):
    yield {"rows": 1}


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        (no_arguments, r"no_arguments\(\)"),
        (two_arguments, r"two_arguments\(context, session\)"),
        (keyword_only, r"keyword_only\(\*, context\)"),
        (lambda: None, r"<lambda>\(\)"),
        (generator_job, "generator function"),
        ("expire_trials", "must be callable"),
    ],
    ids=["no-arguments", "two-arguments", "keyword-only", "lambda-without-context", "generator", "not-callable"],
)
def test_add_job_refuses_a_wrong_signature_naming_the_job_and_the_expected_one(kit, function, shown):
    before = kit.scheduler.jobs()
    with pytest.raises(ConfigurationError, match=shown) as refused:
        kit.scheduler.add_job("billing.expire-trials", function, every(minutes=1))
    assert "'billing.expire-trials'" in str(refused.value)
    assert "def job(context: JobContext)" in str(refused.value)
    assert kit.scheduler.jobs() == before


# -- fire times reach the job through APScheduler's public API -------------------


def test_each_run_gets_its_exact_fire_time_from_the_trigger_not_the_clock(kit):
    fired: list[datetime] = []
    kit.scheduler.add_job("test.grid", lambda context: fired.append(context.scheduled_for), every(seconds=0.2))
    kit.scheduler.start()
    wait_until(lambda: len(fired) >= 3, message="three runs")
    kit.scheduler.shutdown()
    step = timedelta(seconds=0.2)
    assert all((moment - INTERVAL_ANCHOR) % step == timedelta(0) for moment in fired)  # on the grid, to the microsecond
    assert all(later - earlier >= step for earlier, later in zip(fired, fired[1:], strict=False))


def test_a_starting_scheduler_does_not_fire_todays_calendar_occurrence_that_has_passed(kit):
    # Before: calendar_interval started from the boot date and fired a past first fire time at once on promotion.
    passed = datetime.now(UTC) - timedelta(minutes=1)
    daily = calendar_interval(timezone="UTC", days=1, hour=passed.hour, minute=passed.minute)
    kit.scheduler.add_job("test.daily", lambda context: None, daily)
    kit.scheduler.start()
    [info] = [info for info in kit.scheduler.jobs() if info.id == "test.daily"]
    assert info.next_run_at > datetime.now(UTC) + timedelta(hours=23)


# -- the environment warning ----------------------------------------------------


@pytest.mark.parametrize(("environment", "warned"), [("development", True), ("test", True), ("production", False)])
def test_every_start_outside_production_warns_that_a_failed_election_runs_without_the_lock(
    engine, caplog, environment, warned
):
    settings = QUIET.model_copy(update={"environment": environment, "leader_tick_seconds": 0.05})
    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit.leader.scheduler"):
            kit.scheduler.elect()
            kit.scheduler.elect()  # idempotent: one start, one warning
            kit.scheduler.resign()
            kit.scheduler.elect()  # a new start warns again
        warnings = [record for record in caplog.records if "OUTBOXKIT_ENVIRONMENT=production" in record.getMessage()]
        assert len(warnings) == (2 if warned else 0)
        assert all(record.levelno == logging.WARNING and environment in record.getMessage() for record in warnings)
    finally:
        kit.close()
