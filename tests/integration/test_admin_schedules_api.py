"""The schedules' JSON API: every action, 422s that name the field and change nothing, 404s, the JSON-only guard."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest
from sqlalchemy import text

from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.schedule_admin import (  # noqa: F401  (fixtures)
    START,
    ScheduleAdminApp,
    schedule_admin,
    schedule_admin_module,
)

UTC = timezone.utc
NIGHTLY = {
    "name": "partner.nightly",
    "trigger": {"kind": "cron", "fields": {"hour": 3, "minute": 30}, "timezone": "Europe/Berlin"},
    "target": {"kind": "http", "url": "http://127.0.0.1:9/ping", "outbox": "scheduled-calls", "headers": {"X-A": "1"},
               "body": {"n": 1}},
    "misfire_grace_seconds": 600,
}


@pytest.fixture
def api(schedule_admin: ScheduleAdminApp) -> ScheduleAdminApp:
    return schedule_admin


def state(api: ScheduleAdminApp) -> list[tuple[object, ...]]:
    """Every schedule row and audit entry: equal states mean nothing changed."""
    with api.engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM outboxkit_schedules ORDER BY id")).all()
        audit = connection.execute(text("SELECT id FROM outboxkit_schedule_audit ORDER BY id")).all()
    return [tuple(row) for row in rows] + [("audit", *[row[0] for row in audit])]


def test_create_list_and_read_one_with_fire_times_in_two_zones(api: ScheduleAdminApp):
    created = api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    assert created.status_code == 200, created.text
    assert created.json()["action"] == "create" and created.json()["schedule"]["created_by"] == "admin"

    listing = api.client.get("/admin/api/schedules", params={"viewer_timezone": "Asia/Tokyo"}).json()
    (nightly,) = listing["schedules"]
    assert listing["viewer_timezone"] == "Asia/Tokyo" and listing["jobs"] == ["blocking", "failing", "record"]
    local_times = [time["local"] for time in nightly["next_fire_times"]]
    assert local_times[:2] == ["2026-03-28T03:30:00+01:00", "2026-03-29T03:30:00+02:00"]
    assert nightly["next_fire_times"][0]["viewer"] == "2026-03-28T11:30:00+09:00"
    assert nightly["definition"]["target"] == {**NIGHTLY["target"], "method": "POST"}
    assert api.client.get("/admin/api/schedules/partner.nightly").json()["definition"]["misfire_grace_seconds"] == 600


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"trigger": {"kind": "cron", "fields": {"hour": 3}, "timezone": "Mars/Olympus"}}, ["body", "trigger", "timezone"]),
        ({"trigger": {"kind": "cron", "fields": {"minute": "99"}}}, ["body", "trigger", "fields", "minute"]),
        ({"trigger": {"kind": "every", "fields": {"minutes": 0}}}, ["body", "trigger", "fields", "minutes"]),
        ({"trigger": {"kind": "once", "fields": {"at": "2020-01-01T00:00:00+00:00"}}}, ["body", "trigger", "fields", "at"]),
        ({"target": {"kind": "http", "url": "file:///etc/passwd", "outbox": "scheduled-calls"}}, ["body", "target", "url"]),
        ({"target": {**NIGHTLY["target"], "headers": {"Transfer-Encoding": "chunked"}}}, ["body", "target", "headers"]),
        ({"target": {**NIGHTLY["target"], "headers": {"Authorization": "Bearer abc"}}}, ["body", "target", "headers"]),
        ({"target": {**NIGHTLY["target"], "url": "http://169.254.169.254/"}}, ["body", "target", "url"]),
        ({"target": {"kind": "job", "job": "unknown-job"}}, ["body", "target", "job"]),
        ({"max_running": "1"}, ["body", "max_running"]),
        ({"enabled": "yes"}, ["body", "enabled"]),
        ({"name": "has space"}, ["body", "name"]),
        ({"trigger": {"kind": "every", "fields": {"seconds": 3e11}}}, ["body", "trigger", "fields", "seconds"]),
        ({"trigger": {"kind": "every", "fields": {"seconds": 8e13}}}, ["body", "trigger", "fields", "seconds"]),
        ({"trigger": {"kind": "every", "fields": {"seconds": 2**64}}}, ["body", "trigger", "fields", "seconds"]),
        ({"trigger": {"kind": "every", "fields": {"seconds": 1e18}}}, ["body", "trigger", "fields", "seconds"]),
        ({"trigger": {"kind": "every", "fields": {"days": 1e12}}}, ["body", "trigger", "fields", "days"]),
        ({"trigger": {"kind": "calendar_interval", "fields": {"years": 9000}}}, ["body", "trigger", "fields", "years"]),
        ({"trigger": {"kind": "cron", "fields": {"month": 2, "day": 31}}}, ["body", "trigger", "fields"]),
        ({"trigger": {"kind": "cron", "fields": {"hour": 3}, "timezone": "localtime"}}, ["body", "trigger", "timezone"]),
        ({"trigger": {"kind": "cron", "fields": {"hour": 3}, "timezone": "EST5EDT"}}, ["body", "trigger", "timezone"]),
    ],
)
def test_a_refused_create_is_a_422_naming_the_field_and_changes_nothing(api: ScheduleAdminApp, change, loc):
    before = state(api)
    answer = api.client.post("/admin/api/schedules/new", json={**NIGHTLY, **change})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc
    assert state(api) == before


def test_edit_enable_disable_run_now_and_delete_are_audited(api: ScheduleAdminApp):
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    edited = {key: value for key, value in NIGHTLY.items() if key != "name"}
    edited["trigger"] = {"kind": "every", "fields": {"minutes": 10}}
    answer = api.client.post("/admin/api/schedules/partner.nightly/edit", json=edited)
    assert answer.status_code == 200, answer.text
    assert answer.json()["schedule"]["next_run_at"] == "2026-03-27T12:10:00Z"

    disabled = api.client.post("/admin/api/schedules/partner.nightly/disable", json={}).json()
    assert disabled["schedule"]["definition"]["enabled"] is False and disabled["schedule"]["next_fire_times"] == []
    assert api.client.post("/admin/api/schedules/partner.nightly/enable", json={}).json()["schedule"]["definition"]["enabled"]
    api.kit.clock.advance(seconds=7)  # type: ignore[attr-defined]
    now = api.client.post("/admin/api/schedules/partner.nightly/run-now", json={}).json()
    assert now["schedule"]["next_run_at"] == "2026-03-27T12:00:07Z"
    assert api.client.post("/admin/api/schedules/partner.nightly/delete", json={}).json() == {
        "action": "delete", "name": "partner.nightly", "schedule": None,
    }
    assert api.client.get("/admin/api/schedules/partner.nightly").status_code == 404

    audit = api.client.get("/admin/api/schedules/partner.nightly/audit").json()
    assert [(entry["action"], entry["actor"]) for entry in audit] == [
        ("delete", "admin"), ("run_now", "admin"), ("enable", "admin"), ("disable", "admin"), ("edit", "admin"),
        ("create", "admin"),
    ]


def test_a_refused_edit_names_the_field_and_changes_nothing(api: ScheduleAdminApp):
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    before = state(api)
    edited = {key: value for key, value in NIGHTLY.items() if key != "name"}
    edited["target"] = {"kind": "http", "url": "http://127.0.0.1:9/x", "outbox": "webhooks"}
    answer = api.client.post("/admin/api/schedules/partner.nightly/edit", json=edited)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["body", "target", "outbox"]
    assert state(api) == before


def test_unknown_names_bad_queries_and_bodies_that_are_not_json_are_refused(api: ScheduleAdminApp):
    for path in ("edit", "enable", "disable", "run-now", "delete"):
        body = {key: value for key, value in NIGHTLY.items() if key != "name"} if path == "edit" else {}
        assert api.client.post(f"/admin/api/schedules/nope/{path}", json=body).status_code == 404
    assert api.client.get("/admin/api/schedules/nope").status_code == 404
    bad_zone = api.client.get("/admin/api/schedules", params={"viewer_timezone": "Mars/Olympus"})
    assert bad_zone.status_code == 422 and bad_zone.json()["detail"][0]["loc"] == ["query", "viewer_timezone"]
    bad_outcome = api.client.get("/admin/api/schedules/nope/history", params={"outcome": "exploded"})
    assert bad_outcome.status_code == 422 and bad_outcome.json()["detail"][0]["loc"] == ["query", "outcome"]
    form = api.client.post("/admin/api/schedules/new", data={"name": "x"})
    assert form.status_code == 415
    assert api.client.post("/admin/api/schedules/nope/enable", json={"unexpected": 1}).status_code == 422


def test_the_history_is_paged_newest_first_and_filtered_by_outcome(api: ScheduleAdminApp):
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    for minute, outcome in enumerate(["enqueued", "missed", "enqueued", "abandoned"]):
        api.record_run("partner.nightly", START - timedelta(minutes=10 - minute), outcome)
    first = api.client.get("/admin/api/schedules/partner.nightly/history", params={"limit": 3}).json()
    assert [run["outcome"] for run in first["runs"]] == ["abandoned", "enqueued", "missed"]
    rest = api.client.get(
        "/admin/api/schedules/partner.nightly/history", params={"limit": 3, "before": first["next_before"]}
    ).json()
    assert [run["outcome"] for run in rest["runs"]] == ["enqueued"] and rest["next_before"] is None
    trouble = api.client.get(
        "/admin/api/schedules/partner.nightly/history", params=[("outcome", "missed"), ("outcome", "abandoned")]
    ).json()
    assert [run["outcome"] for run in trouble["runs"]] == ["abandoned", "missed"]
    assert api.client.get("/admin/api/schedules").json()["schedules"][0]["last_run"]["outcome"] == "abandoned"


def test_a_schedule_declared_in_code_is_not_edited_or_deleted_here_and_says_where(api: ScheduleAdminApp):
    from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
    from outboxkit.schedules.store import ScheduleStore

    declared = ScheduleDefinition(name="billing.nightly", trigger=ScheduleTrigger.cron(hour=3), target=JobTarget(job="record"))
    ScheduleStore(api.kit.engine, clock=api.kit.clock, jobs=["record"]).sync_from_code(
        [declared], origins={"billing.nightly": "shop.schedules:12"})
    shown = api.client.get("/admin/api/schedules/billing.nightly").json()
    assert (shown["defined_in"], shown["declared_at"]) == ("code", "shop.schedules:12")
    before = state(api)

    edited = {"trigger": {"kind": "cron", "fields": {"hour": 4}}, "target": {"kind": "job", "job": "record"}}
    for path, body in (("edit", edited), ("delete", {})):
        answer = api.client.post(f"/admin/api/schedules/billing.nightly/{path}", json=body)
        assert answer.status_code == 409, answer.text
        assert "declared in code at shop.schedules:12" in answer.json()["detail"]
    assert state(api) == before
    assert api.client.post("/admin/api/schedules/billing.nightly/disable", json={}).status_code == 200


def test_a_disabled_schedule_shows_no_next_run(api: ScheduleAdminApp):
    api.client.post("/admin/api/schedules/new", json=NIGHTLY)
    api.client.post("/admin/api/schedules/partner.nightly/disable", json={})

    shown = api.client.get("/admin/api/schedules/partner.nightly").json()
    page = api.client.get("/admin/schedules/partner.nightly").text

    assert shown["next_run_at"] is None and shown["next_fire_times"] == []
    next_run = page.split("<dt>Next run</dt>", 1)[1].split("</dd>", 1)[0]
    assert "<time" not in next_run and "disabled" in next_run
