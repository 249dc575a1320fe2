"""Schedule rows: validation that names the field, edits, audit columns, the sync from code, races with a claim."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from sqlalchemy import func, select, text

from outboxkit.errors import InvalidScheduleError, InvalidValueError, ScheduleDeclaredInCode, UnknownScheduleError
from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.storage.tables import schedules as schedule_table
from tests.support.leadership import wait_until
from tests.support.schedules import finish, schedules  # noqa: F401  (fixtures)

UTC = timezone.utc
NOON = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EVERY_MINUTE = ScheduleTrigger.every(minutes=1)
URL = "http://127.0.0.1:9/hook"


# -- validation: every error names its field ------------------------------------------------

BAD_TRIGGERS = [
    ({"kind": "hourly"}, "trigger.kind"),
    ({"kind": "cron", "fields": {"hour": 3}, "timezone": "Europe/Atlantis"}, "trigger.timezone"),
    ({"kind": "cron", "fields": {"hour": 3, "minute": 75}}, "trigger.fields.minute"),
    ({"kind": "cron", "fields": {"day_of_week": "someday"}}, "trigger.fields.day_of_week"),
    ({"kind": "cron", "fields": {"hours": 3}}, "trigger.fields.hours"),
    ({"kind": "cron", "fields": {}}, "trigger.fields"),
    ({"kind": "every", "fields": {"seconds": 0}}, "trigger.fields.seconds"),
    ({"kind": "every", "fields": {"minutes": 0, "seconds": 0}}, "trigger.fields"),
    ({"kind": "every", "fields": {"minutes": -5}}, "trigger.fields.minutes"),
    ({"kind": "every", "fields": {"minutes": 5, "start": "2030-01-01"}}, "trigger.fields.start"),
    ({"kind": "calendar_interval", "fields": {"months": 1, "days": 1}}, "trigger.fields"),
    ({"kind": "calendar_interval", "fields": {"months": 1, "hour": 24}}, "trigger.fields.hour"),
    ({"kind": "calendar_interval", "fields": {"days": 1, "start": "1 March"}}, "trigger.fields.start"),
    ({"kind": "once", "fields": {"at": "2030-01-01T06:00"}}, "trigger.fields.at"),
    ({"kind": "every", "fields": {"seconds": 3e11}}, "trigger.fields.seconds"),
    ({"kind": "every", "fields": {"seconds": 8e13}}, "trigger.fields.seconds"),
    ({"kind": "every", "fields": {"seconds": 2**64}}, "trigger.fields.seconds"),
    ({"kind": "every", "fields": {"seconds": 1e18}}, "trigger.fields.seconds"),
    ({"kind": "every", "fields": {"days": 1e12}}, "trigger.fields.days"),
    ({"kind": "every", "fields": {"days": 36_000, "hours": 36_000}}, "trigger.fields"),
    ({"kind": "calendar_interval", "fields": {"years": 9000}}, "trigger.fields.years"),
    ({"kind": "calendar_interval", "fields": {"years": 90, "months": 200}}, "trigger.fields"),
    ({"kind": "cron", "fields": {"hour": 3}, "timezone": "localtime"}, "trigger.timezone"),
    ({"kind": "cron", "fields": {"hour": 3}, "timezone": "EST5EDT"}, "trigger.timezone"),
    ({"kind": "cron", "fields": {"hour": 3}, "timezone": "posix/Europe/Berlin"}, "trigger.timezone"),
]


@pytest.mark.parametrize(("arguments", "field"), BAD_TRIGGERS, ids=[repr(arguments) for arguments, _ in BAD_TRIGGERS])
def test_a_bad_trigger_is_refused_naming_its_field(arguments, field):
    with pytest.raises(InvalidScheduleError) as raised:
        ScheduleTrigger(**arguments)
    assert raised.value.field == field and str(raised.value).startswith(f"{field}: ")
    assert isinstance(raised.value, InvalidValueError) and isinstance(raised.value, ValueError)


BAD_TARGETS = [
    ({"url": "ftp://127.0.0.1/file", "outbox": "scheduled-calls"}, "target.url"),
    ({"url": "127.0.0.1/hook", "outbox": "scheduled-calls"}, "target.url"),
    ({"url": URL, "outbox": "scheduled-calls", "method": "BREW"}, "target.method"),
    ({"url": URL, "outbox": "scheduled-calls", "headers": {"Bad Name": "x"}}, "target.headers"),
    ({"url": URL, "outbox": "scheduled-calls", "body": {"tags": {"a", "b"}}}, "target.body"),
    ({"url": URL, "outbox": ""}, "target.outbox"),
]


@pytest.mark.parametrize(("arguments", "field"), BAD_TARGETS, ids=[field for _, field in BAD_TARGETS])
def test_a_bad_http_target_is_refused_naming_its_field(arguments, field):
    with pytest.raises(InvalidScheduleError) as raised:
        HttpTarget(**arguments)
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"name": "has space"}, "name"),
        ({"misfire_grace_seconds": -1}, "misfire_grace_seconds"),
        ({"max_running": 0}, "max_running"),
        ({"rerun_if_abandoned": "yes"}, "rerun_if_abandoned"),
    ],
)
def test_bad_limits_are_refused_naming_their_field(options, field):
    arguments = {"name": "tick", "trigger": EVERY_MINUTE, "target": JobTarget(job="record"), **options}
    with pytest.raises(InvalidScheduleError) as raised:
        ScheduleDefinition(**arguments)
    assert raised.value.field == field


def count_rows(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(schedule_table)).scalar_one()


@pytest.mark.parametrize(
    ("definition", "field"),
    [
        (ScheduleDefinition(name="late", trigger=ScheduleTrigger.once(at=NOON - timedelta(seconds=1)),
                            target=JobTarget(job="record")), "trigger.fields.at"),
        (ScheduleDefinition(name="nobody", trigger=EVERY_MINUTE, target=JobTarget(job="not-registered")), "target.job"),
        (ScheduleDefinition(name="plain", trigger=EVERY_MINUTE, target=HttpTarget(url=URL, outbox="sample-events")),
         "target.outbox"),
        (ScheduleDefinition(name="feb31", trigger=ScheduleTrigger.cron(month=2, day=31), target=JobTarget(job="record")),
         "trigger.fields"),
        (ScheduleDefinition(name="bygone", trigger=ScheduleTrigger.cron(year=2029, hour=3), target=JobTarget(job="record")),
         "trigger.fields"),
        (ScheduleDefinition(name="far", trigger=ScheduleTrigger.calendar_interval(days=1, start="9999-12-31"),
                            target=JobTarget(job="record")), "trigger.fields"),
    ],
    ids=["once in the past", "unknown job", "not a request outbox", "31 February", "a cron in a past year",
         "a calendar interval with one occurrence"],
)
def test_the_store_refuses_what_cannot_fire_and_changes_nothing(schedules, engine, definition, field):
    with pytest.raises(InvalidScheduleError) as raised:
        schedules.store.create(definition, actor="alice")
    assert raised.value.field == field
    assert count_rows(engine) == 0


def test_a_name_is_unique_and_an_unknown_name_is_a_lookup_error(schedules, engine):
    schedules.job_schedule("tick", EVERY_MINUTE)
    with pytest.raises(InvalidScheduleError) as raised:
        schedules.job_schedule("tick", ScheduleTrigger.every(hours=1))
    assert raised.value.field == "name" and count_rows(engine) == 1
    assert schedules.store.get("tick").definition.trigger == EVERY_MINUTE
    for action in (lambda: schedules.store.get("nope"), lambda: schedules.store.delete("nope", actor="alice")):
        with pytest.raises(UnknownScheduleError, match="no schedule named 'nope'"):
            action()


# -- rows: stored as data, edited, audited ------------------------------------------------------


def test_a_schedule_is_stored_as_plain_data_and_read_back_equal(schedules, engine):
    definition = ScheduleDefinition(
        name="report",
        trigger=ScheduleTrigger.cron(timezone="Europe/Berlin", hour=6, minute=30, day_of_week="mon-fri"),
        target=HttpTarget(url=URL, outbox="scheduled-calls", method="put", headers={"X-A": "1"}, body={"at": NOON}),
        misfire_grace_seconds=900,
    )
    schedules.store.create(definition, actor="alice")
    with engine.connect() as connection:
        row = connection.execute(text("SELECT trigger_kind, trigger_fields, timezone, http_body FROM outboxkit_schedules")).one()
    assert tuple(row) == ("cron", {"hour": 6, "minute": 30, "day_of_week": "mon-fri"}, "Europe/Berlin",
                          {"at": "2030-01-01T12:00:00+00:00"})
    stored = schedules.store.get("report")
    assert stored.definition == ScheduleDefinition(**{**definition.__dict__, "target": HttpTarget(
        url=URL, outbox="scheduled-calls", method="PUT", headers={"X-A": "1"}, body={"at": "2030-01-01T12:00:00+00:00"})})
    assert stored.next_run_at == datetime(2030, 1, 2, 5, 30, tzinfo=UTC)  # Wednesday 06:30 CET
    assert (stored.created_by, stored.changed_by, stored.defined_in) == ("alice", "alice", "api")


def test_an_edit_keeps_next_run_at_unless_the_trigger_changes_and_records_who(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    clock.advance(seconds=90)  # 12:00 is due and not fired yet
    current = schedules.store.get("tick").definition
    schedules.store.replace(ScheduleDefinition(**{**current.__dict__, "misfire_grace_seconds": 30}), actor="bob")
    edited = schedules.store.get("tick")
    assert edited.next_run_at == NOON  # still due: an edit does not skip an occurrence
    assert (edited.created_by, edited.changed_by, edited.changed_at) == ("test", "bob", clock.now())

    schedules.store.replace(ScheduleDefinition(**{**current.__dict__, "trigger": ScheduleTrigger.every(hours=1)}), actor="bob")
    assert schedules.store.get("tick").next_run_at == NOON + timedelta(hours=1)


def test_a_disabled_schedule_does_not_fire_and_enabling_counts_from_now(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    schedules.store.set_enabled("tick", False, actor="carol")
    clock.advance(minutes=5)
    assert runner.fire_due().runs == [] and schedules.history("tick") == []
    schedules.store.set_enabled("tick", True, actor="carol")
    assert schedules.store.get("tick").next_run_at == NOON + timedelta(minutes=6)
    clock.advance(minutes=1)
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.history("tick") == [(NOON + timedelta(minutes=6), "ok")]  # no misfire for the disabled time


def test_run_now_on_a_disabled_schedule_runs_one_occurrence_and_leaves_it_disabled(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    schedules.store.set_enabled("tick", False, actor="carol")
    clock.advance(seconds=30)
    asked = clock.now()
    assert schedules.store.run_now("tick", actor="carol").definition.enabled is False
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.store.get("tick").definition.enabled is False
    clock.advance(minutes=5)
    assert runner.fire_due().runs == []  # no further occurrence: the schedule is still disabled
    assert schedules.history("tick") == [(asked, "ok")]


def test_run_now_on_an_enabled_schedule_runs_at_once_and_then_keeps_the_trigger(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    clock.advance(seconds=30)
    asked = clock.now()
    schedules.store.run_now("tick", actor="carol")
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.store.get("tick").next_run_at == NOON + timedelta(minutes=1)
    clock.advance(seconds=30)
    assert finish(runner.fire_due()) == ["ok"]
    assert schedules.history("tick") == [(asked, "ok"), (NOON + timedelta(minutes=1), "ok")]


def test_a_deleted_schedule_stops_firing_and_keeps_its_history(schedules, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    finish(runner.fire_due())
    schedules.store.delete("tick", actor="dave")
    clock.advance(minutes=1)
    assert runner.fire_due().runs == []
    assert schedules.history("tick") == [(NOON, "ok")]


def test_every_change_notifies_the_schedules_channel(schedules, database_url):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN outboxkit_schedules")
        schedules.job_schedule("tick", EVERY_MINUTE)
        schedules.store.set_enabled("tick", False, actor="erin")
        schedules.store.run_now("tick", actor="erin")
        schedules.store.delete("tick", actor="erin")
        payloads = []
        for notification in listener.notifies(timeout=10, stop_after=4):
            payloads.append((notification.channel, notification.payload))
    assert payloads == [("outboxkit_schedules", "tick")] * 4


# -- schedules defined in code --------------------------------------------------------------------


def test_the_sync_from_code_inserts_updates_and_keeps_the_rows_state(schedules, clock):
    nightly = ScheduleDefinition(name="nightly", trigger=ScheduleTrigger.cron(hour=3), target=JobTarget(job="record"))
    tick = ScheduleDefinition(name="tick", trigger=EVERY_MINUTE, target=JobTarget(job="record"))
    assert schedules.store.sync_from_code([nightly, tick]) == {"inserted": 2, "updated": 0, "unchanged": 0, "removed": 0}
    schedules.store.set_enabled("nightly", False, actor="operator")
    clock.advance(minutes=3)  # a deploy: tick's 12:00 is due and not fired

    changed = ScheduleDefinition(**{**tick.__dict__, "misfire_grace_seconds": 600})
    assert schedules.store.sync_from_code([nightly, changed]) == {"inserted": 0, "updated": 1, "unchanged": 1, "removed": 0}

    assert schedules.store.get("nightly").definition.enabled is False  # the operator's choice outlives the deploy
    synced = schedules.store.get("tick")
    assert synced.next_run_at == NOON and synced.definition.misfire_grace_seconds == 600
    assert (synced.defined_in, synced.changed_by) == ("code", "code")
    assert finish(schedules.runner().fire_due()) == ["ok"]  # the occurrence that fell into the deploy runs, late
    assert schedules.jobs.calls == [("tick", NOON + timedelta(minutes=3))]


def test_a_schedule_declared_in_code_refuses_an_edit_or_a_delete_saying_where_and_keeps_its_controls(schedules, engine):
    nightly = ScheduleDefinition(name="nightly", trigger=ScheduleTrigger.cron(hour=3), target=JobTarget(job="record"))
    origin = {"nightly": "shop.schedules:12"}
    schedules.store.sync_from_code([nightly], origins=origin)
    assert schedules.store.get("nightly").declared_at == "shop.schedules:12"
    with engine.connect() as connection:
        audited = connection.execute(text("SELECT count(*) FROM outboxkit_schedule_audit")).scalar_one()

    edited = ScheduleDefinition(**{**nightly.__dict__, "misfire_grace_seconds": 60})
    for change in (lambda: schedules.store.replace(edited, actor="bob"), lambda: schedules.store.delete("nightly", actor="bob")):
        with pytest.raises(ScheduleDeclaredInCode, match=r"'nightly' is declared in code at shop\.schedules:12"):
            change()
    assert schedules.store.get("nightly").definition == nightly
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_schedule_audit")).scalar_one() == audited

    schedules.store.set_enabled("nightly", False, actor="carol")  # the operator's controls stay
    schedules.store.run_now("nightly", actor="carol")
    assert schedules.store.sync_from_code([nightly], origins=origin) == {
        "inserted": 0, "updated": 0, "unchanged": 1, "removed": 0,
    }
    assert schedules.store.get("nightly").definition.enabled is False


# -- an edit and a disable racing a claim -----------------------------------------------------------


def blocked_on_a_lock(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        ).scalar_one()


@pytest.fixture
def claim_held_open(schedules, engine, receiver):
    """A claim of the HTTP schedule 'ping' that has locked its row and waits inside its transaction.

    The outbox table is locked against inserts, so the claim's enqueue waits; ``release()`` lets it commit.
    """
    schedules.http_schedule("ping", EVERY_MINUTE, receiver.url + "/ping")
    blocker = engine.connect()
    blocker.begin()
    blocker.execute(text("LOCK TABLE scheduled_call_outbox IN SHARE MODE"))
    result = {}
    claim = threading.Thread(target=lambda: result.update(firing=schedules.runner().fire_due()))
    claim.start()
    wait_until(lambda: blocked_on_a_lock(engine) == 1, timeout=30, message="the claim waiting inside its transaction")

    def release():
        blocker.rollback()
        blocker.close()
        claim.join(timeout=30)
        return result["firing"]

    yield release
    if blocker.in_transaction():
        blocker.rollback()
        blocker.close()
    claim.join(timeout=30)


def test_a_disable_racing_a_claim_waits_for_it_and_the_occurrence_fires_once(schedules, engine, clock, claim_held_open):
    disable = threading.Thread(target=lambda: schedules.store.set_enabled("ping", False, actor="alice"))
    disable.start()
    wait_until(lambda: blocked_on_a_lock(engine) == 2, timeout=30, message="the disable waiting for the row")

    firing = claim_held_open()
    disable.join(timeout=30)

    assert firing.enqueued == [("ping", NOON)]
    stored = schedules.store.get("ping")
    assert stored.definition.enabled is False and stored.changed_by == "alice"
    assert stored.next_run_at == NOON + timedelta(minutes=1)  # the claim's advance stands
    clock.advance(minutes=5)
    assert schedules.runner().fire_due().enqueued == []
    assert len(schedules.calls()) == 1 and schedules.history("ping") == [(NOON, "enqueued")]


def test_an_edit_racing_a_claim_applies_after_it_to_the_advanced_row(schedules, engine, clock, claim_held_open):
    current = schedules.store.get("ping").definition
    hourly = ScheduleDefinition(**{**current.__dict__, "trigger": ScheduleTrigger.every(hours=1)})
    edit = threading.Thread(target=lambda: schedules.store.replace(hourly, actor="bob"))
    edit.start()
    wait_until(lambda: blocked_on_a_lock(engine) == 2, timeout=30, message="the edit waiting for the row")

    firing = claim_held_open()
    edit.join(timeout=30)

    assert firing.enqueued == [("ping", NOON)]
    assert schedules.store.get("ping").next_run_at == NOON + timedelta(hours=1)  # the new trigger, counted from now
    clock.advance(minutes=30)
    assert schedules.runner().fire_due().enqueued == []
    clock.advance(minutes=30)
    assert schedules.runner().fire_due().enqueued == [("ping", NOON + timedelta(hours=1))]


def test_a_claim_skips_a_row_an_edit_holds_and_fires_it_after_the_edit(schedules, engine):
    schedules.job_schedule("tick", EVERY_MINUTE)
    runner = schedules.runner()
    with engine.begin() as connection:  # an edit in progress holds the row
        connection.execute(text("SELECT 1 FROM outboxkit_schedules WHERE name = 'tick' FOR UPDATE"))
        assert runner.fire_due().runs == []  # skipped, not waited for
    assert finish(runner.fire_due()) == ["ok"]


# -- the audit: who changed what, when ---------------------------------------------------------


def audit(engine) -> list:
    with engine.connect() as connection:
        return list(connection.execute(
            text("SELECT at, actor, schedule, action, before, after FROM outboxkit_schedule_audit ORDER BY id")
        ).mappings())


def test_every_change_is_audited_with_the_row_before_and_after(schedules, engine, clock):
    schedules.job_schedule("tick", EVERY_MINUTE)
    clock.advance(minutes=1)
    current = schedules.store.get("tick").definition
    schedules.store.replace(ScheduleDefinition(**{**current.__dict__, "max_running": 2}), actor="bob")
    schedules.store.set_enabled("tick", False, actor="carol")
    schedules.store.set_enabled("tick", True, actor="carol")
    schedules.store.run_now("tick", actor="dave")
    schedules.store.delete("tick", actor="erin")

    entries = audit(engine)
    assert [(entry["actor"], entry["action"]) for entry in entries] == [
        ("test", "create"), ("bob", "edit"), ("carol", "disable"), ("carol", "enable"), ("dave", "run_now"),
        ("erin", "delete"),
    ]
    create, edit, *_, run_now, deleted = entries
    assert create["before"] is None and create["after"]["trigger_fields"] == {"minutes": 1}
    assert create["at"] == NOON and edit["at"] == NOON + timedelta(minutes=1)
    assert (edit["before"]["max_running"], edit["after"]["max_running"]) == (1, 2)
    assert run_now["after"]["next_run_at"] == (NOON + timedelta(minutes=1)).isoformat()
    assert deleted["before"]["name"] == "tick" and deleted["after"] is None


def test_a_refused_change_is_not_audited(schedules, engine):
    schedules.job_schedule("tick", EVERY_MINUTE)
    with pytest.raises(InvalidScheduleError):
        schedules.job_schedule("tick", EVERY_MINUTE)
    with pytest.raises(UnknownScheduleError):
        schedules.store.set_enabled("nope", False, actor="mallory")
    assert [entry["action"] for entry in audit(engine)] == ["create"]


def test_the_sync_from_code_is_audited_only_when_it_changes_something(schedules, engine):
    tick = ScheduleDefinition(name="tick", trigger=EVERY_MINUTE, target=JobTarget(job="record"))
    schedules.store.sync_from_code([tick])
    schedules.store.sync_from_code([tick])
    schedules.store.sync_from_code([ScheduleDefinition(**{**tick.__dict__, "max_running": 3})])
    assert [(entry["actor"], entry["action"], entry["before"] is None) for entry in audit(engine)] == [
        ("code", "sync", True), ("code", "sync", False),
    ]
