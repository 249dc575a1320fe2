""""Run now" is bounded per person: past OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE in a minute, a clear refusal
(429 with Retry-After in the admin) that changes nothing; another person, or the next minute, is not refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from outboxkit import ManualClock, OutboxKitSettings
from outboxkit.errors import RunNowLimited
from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.store import ScheduleStore
from outboxkit.storage.tables import schedule_audit
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)
HOURLY = ScheduleDefinition(name="report.hourly", trigger=ScheduleTrigger.every(hours=1), target=JobTarget(job="record"))


def audit_count(engine) -> int:
    with engine.connect() as connection:
        return connection.scalar(select(func.count()).select_from(schedule_audit)) or 0


def test_one_person_is_refused_past_the_limit_and_others_and_the_next_minute_are_not(engine, clock):
    store = ScheduleStore(engine, clock=clock, jobs=["record"], run_now_per_minute=2)
    store.create(HOURLY, actor="alice")
    store.run_now("report.hourly", actor="alice")
    clock.advance(seconds=10)
    store.run_now("report.hourly", actor="alice")
    before = audit_count(engine)
    clock.advance(seconds=20)
    with pytest.raises(RunNowLimited, match="at most 2 times a minute.*again in 30 s") as refused:
        store.run_now("report.hourly", actor="alice")
    assert refused.value.retry_after == 30
    assert audit_count(engine) == before
    store.run_now("report.hourly", actor="bob")
    clock.advance(seconds=31)
    store.run_now("report.hourly", actor="alice")


@pytest.fixture(scope="module")
def limited_admin(admin_database_url) -> Iterator[ScheduleAdminApp]:
    settings = OutboxKitSettings(listen_enabled=False, schedule_run_now_per_minute=3)
    with schedule_admin_app(admin_database_url, clock=ManualClock(START), settings=settings) as app:
        yield app


def test_the_admin_api_answers_429_with_retry_after_and_changes_nothing(limited_admin: ScheduleAdminApp):
    api = limited_admin
    api.clear()
    created = api.client.post("/admin/api/schedules/new", json={
        "name": "report.hourly", "trigger": {"kind": "every", "fields": {"hours": 1}},
        "target": {"kind": "job", "job": "record"},
    })
    assert created.status_code == 200, created.text
    answers = [api.client.post("/admin/api/schedules/report.hourly/run-now", json={}) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    assert answers[-1].headers["Retry-After"] == "60"
    assert "OUTBOXKIT_SCHEDULE_RUN_NOW_PER_MINUTE" in answers[-1].json()["detail"]
    assert audit_count(api.engine) == 4  # the create and three run-nows
