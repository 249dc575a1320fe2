"""The operator's schedule actions (outboxkit.operations.schedule_admin) against the real database.

Listing with the next five fire times in two timezones, every change audited
with its actor, refusals that name the field and write nothing, the history
paged, and an edit that reaches a sleeping runner through NOTIFY.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, func, select

from outboxkit import ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.errors import InvalidScheduleError, InvalidValueError, UnknownScheduleError
from outboxkit.operations.schedule_admin import ScheduleAdmin
from outboxkit.operations.schedule_schemas import ScheduleCreate, ScheduleFields
from outboxkit.schedules.definitions import ScheduleTrigger
from outboxkit.storage.tables import job_runs, schedule_audit
from outboxkit.storage.tables import schedules as schedule_rows
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent, ScheduledCall
from tests.support.schedules import ScheduleHarness, schedules  # noqa: F401  (fixture)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def kit(engine: Engine, clock: ManualClock) -> Iterator[OutboxKit]:
    settings = OutboxKitSettings(listen_enabled=False, url_allow_list=("127.0.0.1/32",))  # the receivers' address
    kit = OutboxKit(engine, [SampleEvent, ScheduledCall], clock=clock, settings=settings)
    yield kit
    kit.close()


@pytest.fixture
def admin(kit: OutboxKit) -> ScheduleAdmin:
    return ScheduleAdmin(kit, jobs=["record", "blocking", "failing"])


def http_request(name: str, **trigger: object) -> ScheduleCreate:
    return ScheduleCreate.model_validate({
        "name": name,
        "trigger": trigger or {"kind": "cron", "fields": {"hour": 3, "minute": 30}, "timezone": "Europe/Berlin"},
        "target": {"kind": "http", "url": "http://127.0.0.1:9/ping", "outbox": "scheduled-calls", "body": {"n": 1}},
    })


def job_request(name: str, job: str = "record", **fields: object) -> ScheduleCreate:
    return ScheduleCreate.model_validate({
        "name": name, "trigger": {"kind": "every", "fields": {"minutes": 1}}, "target": {"kind": "job", "job": job}, **fields,
    })


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        rows = connection.execute(select(func.count()).select_from(schedule_rows)).scalar_one()
        audit = connection.execute(select(func.count()).select_from(schedule_audit)).scalar_one()
    return rows, audit


def test_the_list_shows_the_next_five_fire_times_in_the_schedules_zone_and_the_viewers(admin: ScheduleAdmin, clock):
    clock.set(datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
    admin.create(http_request("partner.nightly"), actor="alice")
    admin.create(job_request("tick"), actor="alice")

    view = admin.overview(viewer_timezone="America/New_York")
    assert [schedule.name for schedule in view.schedules] == ["partner.nightly", "tick"]
    nightly = view.schedules[0]
    # Berlin springs forward on 2026-03-29: 02:30 does not exist that night and fires at 03:30 (as pinned by the triggers).
    assert [time.local.isoformat() for time in nightly.next_fire_times] == [
        "2026-03-28T03:30:00+01:00", "2026-03-29T03:30:00+02:00", "2026-03-30T03:30:00+02:00",
        "2026-03-31T03:30:00+02:00", "2026-04-01T03:30:00+02:00",
    ]
    assert nightly.next_fire_times[0].viewer.isoformat() == "2026-03-27T22:30:00-04:00"
    assert nightly.description == "cron(hour=3, minute=30) in Europe/Berlin"
    assert nightly.definition.target.kind == "http" and nightly.last_run is None
    assert nightly.created_by == "alice" and nightly.defined_in == "api"
    assert view.jobs == ["blocking", "failing", "record"] and view.outboxes == ["scheduled-calls"]
    with pytest.raises(InvalidValueError, match="viewer_timezone: unknown IANA timezone 'Mars/Olympus'"):
        admin.overview(viewer_timezone="Mars/Olympus")


@pytest.mark.parametrize(
    ("request_body", "field"),
    [
        ({"trigger": {"kind": "cron", "fields": {"hour": 3}, "timezone": "Mars/Olympus"}}, "trigger.timezone"),
        ({"trigger": {"kind": "cron", "fields": {"minute": "61"}}}, "trigger.fields.minute"),
        ({"trigger": {"kind": "every", "fields": {"seconds": 0}}}, "trigger.fields.seconds"),
        ({"trigger": {"kind": "once", "fields": {"at": "2029-12-31T00:00:00+00:00"}}}, "trigger.fields.at"),
        ({"target": {"kind": "http", "url": "ftp://127.0.0.1/x", "outbox": "scheduled-calls"}}, "target.url"),
        ({"target": {"kind": "http", "url": "http://127.0.0.1/x", "outbox": "sample-events"}}, "target.outbox"),
        ({"target": {"kind": "job", "job": "no-such-job"}}, "target.job"),
        ({"max_running": 0}, "max_running"),
        ({"misfire_grace_seconds": -1}, "misfire_grace_seconds"),
    ],
)
def test_a_refused_create_names_the_field_and_writes_nothing(admin: ScheduleAdmin, engine, request_body, field):
    body = {**job_request("refused").model_dump(), **request_body}
    before = counts(engine)
    with pytest.raises(InvalidScheduleError) as refused:
        admin.create(ScheduleCreate.model_validate(body), actor="alice")
    assert refused.value.field == field
    assert counts(engine) == before


def test_a_taken_name_is_refused_on_the_name_and_an_edit_of_a_missing_one_creates_nothing(admin: ScheduleAdmin, engine):
    admin.create(job_request("tick"), actor="alice")
    before = counts(engine)
    with pytest.raises(InvalidScheduleError) as refused:
        admin.create(job_request("tick"), actor="bob")
    assert refused.value.field == "name"
    with pytest.raises(UnknownScheduleError):
        admin.edit("nope", ScheduleFields.model_validate(job_request("nope").model_dump(exclude={"name"})), actor="bob")
    with pytest.raises(UnknownScheduleError):
        admin.run_now("nope", actor="bob")
    assert counts(engine) == before


def test_every_change_is_audited_with_its_actor(admin: ScheduleAdmin, engine, clock):
    admin.create(job_request("tick"), actor="alice")
    edited = job_request("tick").model_dump(exclude={"name"})
    edited["trigger"] = {"kind": "cron", "fields": {"minute": "*/5"}, "timezone": "UTC"}
    edited["misfire_grace_seconds"] = 60
    result = admin.edit("tick", ScheduleFields.model_validate(edited), actor="bob")
    assert result.schedule is not None and result.schedule.next_run_at == NOON + timedelta(minutes=5)
    assert result.schedule.definition.misfire_grace_seconds == 60 and result.schedule.changed_by == "bob"

    assert admin.disable("tick", actor="carol").schedule.next_fire_times == []  # type: ignore[union-attr]
    assert admin.enable("tick", actor="carol").schedule.definition.enabled  # type: ignore[union-attr]
    clock.advance(seconds=30)
    assert admin.run_now("tick", actor="dave").schedule.next_run_at == NOON + timedelta(seconds=30)  # type: ignore[union-attr]
    admin.delete("tick", actor="erin")
    with pytest.raises(UnknownScheduleError):
        admin.schedule("tick")

    trail = [(entry.action, entry.actor) for entry in reversed(admin.audit("tick"))]
    assert trail == [
        ("create", "alice"), ("edit", "bob"), ("disable", "carol"), ("enable", "carol"), ("run_now", "dave"), ("delete", "erin"),
    ]
    last = admin.audit("tick", limit=1)[0]
    assert last.after is None and last.before is not None and last.before["trigger_fields"] == {"minute": "*/5"}


def test_the_history_pages_through_runs_misses_and_abandoned_runs(admin: ScheduleAdmin, engine):
    admin.create(job_request("tick"), actor="alice")
    with engine.begin() as connection:
        for minute, outcome in enumerate(["ok", "missed", "abandoned", "error", "ok"]):
            connection.execute(job_runs.insert().values(
                job_id="tick", job_name="tick", scheduled_for=NOON + timedelta(minutes=minute),
                started_at=NOON + timedelta(minutes=minute), outcome=outcome, counts={}, leader="host:1:a",
            ))

    first = admin.history("tick", limit=2)
    assert [run.outcome for run in first.runs] == ["ok", "error"]
    assert first.next_before == NOON + timedelta(minutes=3)
    second = admin.history("tick", limit=2, before=first.next_before)
    assert [run.outcome for run in second.runs] == ["abandoned", "missed"]
    last = admin.history("tick", limit=2, before=second.next_before)
    assert [run.outcome for run in last.runs] == ["ok"] and last.next_before is None
    trouble = admin.history("tick", outcomes=["missed", "abandoned"])
    assert [run.scheduled_for for run in trouble.runs] == [NOON + timedelta(minutes=2), NOON + timedelta(minutes=1)]
    assert admin.overview().schedules[0].last_run.outcome == "ok"  # type: ignore[union-attr]
    with pytest.raises(InvalidValueError):
        admin.history("tick", outcomes=["exploded"])
    with pytest.raises(InvalidValueError):
        admin.history("tick", limit=0)


def test_a_job_is_known_when_declared_or_when_a_schedule_row_already_targets_it(kit: OutboxKit, admin: ScheduleAdmin):
    admin.create(job_request("nightly", job="failing"), actor="alice")
    undeclared = ScheduleAdmin(kit)  # the CLI's view: no registry of its own
    assert undeclared.job_names() == ["failing"]
    undeclared.create(job_request("nightly.again", job="failing"), actor="cli")
    with pytest.raises(InvalidScheduleError, match="target.job: no job 'record' is registered"):
        undeclared.create(job_request("other", job="record"), actor="cli")


def test_an_edit_reaches_a_sleeping_runner_through_notify(admin: ScheduleAdmin, schedules: ScheduleHarness):
    schedules.job_schedule("daily", ScheduleTrigger.cron(hour=0, minute=0))
    runner = schedules.runner(max_idle_seconds=3600)  # only a NOTIFY can wake it within the test
    runner.start()
    wait_until(lambda: runner.idle, timeout=60, message="the runner sleeps, listening")
    assert schedules.jobs.calls == []

    admin.run_now("daily", actor="alice")
    wait_until(lambda: schedules.jobs.calls, timeout=60, message="the runner ran the occurrence run_now made due")
    assert schedules.jobs.calls == [("daily", NOON)]
