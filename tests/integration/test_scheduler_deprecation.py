"""One scheduling concept: ``kit.scheduler.add_job`` still works but warns once, naming ``kit.schedules.add_job``;
the kit's own elected jobs never warn; and the elected scheduler takes the one trigger vocabulary, ``ScheduleTrigger``."""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.schedules import ScheduleTrigger
from outboxkit.schedules.jobs import cron
from tests.support.models import SampleEvent

UTC = timezone.utc
QUIET = OutboxKitSettings(drain_interval_seconds=3600, listen_enabled=False)


def nightly(context: object) -> None:
    return None


def test_add_job_warns_once_per_kit_naming_the_replacement_and_the_docs_section(engine):
    with OutboxKit(engine, [SampleEvent], settings=QUIET) as kit:
        with pytest.warns(DeprecationWarning) as caught:
            kit.scheduler.add_job("app.nightly", nightly, cron(timezone="UTC", hour=2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second registration says nothing more
            kit.scheduler.add_job("app.hourly", nightly, cron(timezone="UTC", minute=5))
        assert {job.id for job in kit.scheduler.jobs()} >= {"app.nightly", "app.hourly"}  # both still registered
    [warning] = caught.list
    message = str(warning.message)
    assert "kit.scheduler.add_job is deprecated" in message
    assert "kit.schedules.add_job(" in message and "ScheduleTrigger" in message
    assert "docs/schedules.md" in message and "Moving from kit.scheduler.add_job" in message
    assert warning.filename == __file__  # points at the caller, not at the kit


def test_the_kits_own_elected_jobs_never_warn(engine):
    settings = OutboxKitSettings(
        drain_interval_seconds=3600, listen_enabled=False, inbox_retention_days=7,
        outboxes={"sample_events": {"retain_done_for": 7 * 86400}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with OutboxKit(engine, [SampleEvent], settings=settings) as kit:
            ids = {job.id for job in kit.scheduler.jobs()}
            kit.scheduler.start()
            kit.scheduler.shutdown()
    assert {"outboxkit.drain.sample-events", "outboxkit.retention.inbox", "outboxkit.retention.sample-events"} <= ids


@pytest.mark.filterwarnings("ignore:kit.scheduler.add_job is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    "trigger",
    [
        ScheduleTrigger.cron(timezone="Europe/Berlin", hour=3, minute=30),
        ScheduleTrigger.every(minutes=5),
        ScheduleTrigger.calendar_interval(timezone="Europe/Berlin", months=1, hour=6),
        ScheduleTrigger.once(at="2030-01-01T06:00:00+01:00"),
    ],
    ids=lambda trigger: trigger.kind,
)
def test_the_elected_scheduler_takes_a_schedule_trigger_with_the_same_fire_times(engine, trigger):
    with OutboxKit(engine, [SampleEvent], settings=QUIET) as kit:
        job = kit.scheduler.add_job("app.job", nightly, trigger)
        moment = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)
        elected = job.trigger.get_next_fire_time(None, moment)
        assert elected is not None
        assert elected.astimezone(UTC) == trigger.first_at_or_after(moment)
        if trigger.kind != "once":
            following = job.trigger.get_next_fire_time(elected, elected + timedelta(microseconds=1))
            assert following is not None and following.astimezone(UTC) == trigger.next_after(elected.astimezone(UTC))
        [info] = [info for info in kit.scheduler.jobs() if info.id == "app.job"]
        assert info.next_run_at is not None
