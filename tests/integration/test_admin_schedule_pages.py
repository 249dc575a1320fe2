"""The schedule pages over HTTP (no browser): forms that refuse with the error next to the field and change
nothing, CSRF on every action, the viewer's timezone from ?tz=, refusals as error pages."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from outboxkit import ManualClock
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)
FORM = {
    "name": "tick", "trigger_kind": "cron", "trigger_fields": "minute=*/5", "timezone": "Europe/Berlin",
    "target_kind": "job", "job": "record", "misfire_grace_seconds": "300", "max_running": "1", "enabled": "on",
}


@pytest.fixture(scope="module")
def module_app(admin_database_url) -> Iterator[ScheduleAdminApp]:
    with schedule_admin_app(admin_database_url, clock=ManualClock(START)) as app:
        yield app


@pytest.fixture
def pages(module_app: ScheduleAdminApp) -> ScheduleAdminApp:
    module_app.clear()
    return module_app


def token(pages: ScheduleAdminApp) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', pages.client.get("/admin/schedules/_new").text)
    assert found is not None
    return found.group(1)


def field_errors(page: str) -> dict[str, str]:
    found = re.findall(r'<p class="field-error" id="error-([a-z_]+)" role="alert">(.*?)</p>', page)
    return {name: html.unescape(message) for name, message in found}


def rows(pages: ScheduleAdminApp) -> list[tuple[object, ...]]:
    with pages.engine.connect() as connection:
        schedules = connection.execute(text("SELECT name, trigger_fields, enabled FROM outboxkit_schedules ORDER BY name")).all()
        audit = connection.execute(text("SELECT action, actor FROM outboxkit_schedule_audit ORDER BY id")).all()
    return [tuple(row) for row in schedules] + [("audit", *map(tuple, audit))]


@pytest.mark.parametrize(
    ("change", "input_name", "says"),
    [
        ({"trigger_fields": "minute=99"}, "trigger_fields", "trigger.fields.minute"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown IANA timezone"),
        ({"trigger_kind": "every", "trigger_fields": "seconds=0"}, "trigger_fields", "positive interval"),
        ({"trigger_kind": "once", "trigger_fields": "at=2020-01-01T00:00:00+00:00"}, "trigger_fields", "in the past"),
        ({"target_kind": "http", "http_url": "ftp://127.0.0.1/x", "http_outbox": "scheduled-calls"}, "http_url", "target.url"),
        ({"target_kind": "http", "http_url": "http://127.0.0.1/x", "http_outbox": "scheduled-calls", "http_body": "{"},
         "http_body", "must be JSON"),
        ({"job": "nope"}, "job", "no job 'nope' is registered"),
        ({"max_running": "two"}, "max_running", "whole number"),
        ({"name": "has space"}, "name", "name"),
        ({"trigger_fields": "minute"}, "trigger_fields", "name=value"),
        ({"trigger_kind": "every", "trigger_fields": "seconds=300000000000"}, "trigger_fields", "at most"),
        ({"trigger_kind": "every", "trigger_fields": "seconds=18446744073709551616"}, "trigger_fields", "must be a number"),
        ({"trigger_kind": "every", "trigger_fields": "days=999999999999"}, "trigger_fields", "at most"),
        ({"trigger_kind": "calendar_interval", "trigger_fields": "years=9000"}, "trigger_fields", "at most"),
        ({"trigger_fields": "month=2\nday=31"}, "trigger_fields", "never fires"),
        ({"timezone": "localtime"}, "timezone", "not an IANA"),
        ({"timezone": "EST5EDT"}, "timezone", "not an IANA"),
    ],
)
def test_a_refused_form_comes_back_with_the_error_next_to_its_field_and_nothing_changes(pages, change, input_name, says):
    before = rows(pages)
    answer = pages.client.post("/admin/schedules/_new", data={**FORM, **change, "csrf_token": token(pages)})
    assert answer.status_code == 422
    errors = field_errors(answer.text)
    assert input_name in errors and says in errors[input_name], errors
    assert f'aria-describedby="error-{input_name}"' in answer.text or input_name == "name"
    for name, value in change.items():  # what was typed is shown again
        assert value in html.unescape(answer.text) or name == "trigger_kind"
    assert rows(pages) == before


def test_create_edit_and_every_action_need_the_csrf_token_and_are_audited(pages):
    csrf = token(pages)
    created = pages.client.post("/admin/schedules/_new", data={**FORM, "csrf_token": csrf})
    assert created.status_code == 303 and created.headers["location"] == "/admin/schedules/tick"
    for path in ("tick/enable", "tick/disable", "tick/run-now", "tick/delete", "tick/edit", "_new"):
        before = rows(pages)
        assert pages.client.post(f"/admin/schedules/{path}", data={**FORM, "name": "other"}).status_code == 403
        assert rows(pages) == before
    edited_form = {**FORM, "trigger_fields": "minute=0\nhour=6", "csrf_token": csrf}
    edited = pages.client.post("/admin/schedules/tick/edit", data=edited_form)
    assert edited.status_code == 303
    assert pages.client.post("/admin/schedules/tick/disable", data={"csrf_token": csrf, "back": "list"}).headers[
        "location"] == "/admin/schedules"
    assert pages.client.post("/admin/schedules/tick/run-now", data={"csrf_token": csrf}).headers[
        "location"] == "/admin/schedules/tick"
    assert pages.client.get("/admin/schedules/tick/delete").status_code == 200  # asks first; changes nothing
    assert pages.client.post("/admin/schedules/tick/delete", data={"csrf_token": csrf}).status_code == 303
    assert rows(pages) == [("audit", ("create", "admin"), ("edit", "admin"), ("disable", "admin"), ("run_now", "admin"),
                                      ("delete", "admin"))]


def test_the_viewer_timezone_comes_from_tz_and_an_unknown_one_is_refused(pages):
    pages.client.post("/admin/schedules/_new", data={**FORM, "csrf_token": token(pages)})
    utc = pages.client.get("/admin/schedules").text
    assert "data-viewer-zone-auto" in utc  # the browser's zone may replace UTC
    assert re.findall(r"data-viewer-time>([^<]+)<", utc)[0] == "2026-03-27 12:00:00 UTC"
    tokyo = pages.client.get("/admin/schedules", params={"tz": "Asia/Tokyo"}).text
    assert "data-viewer-zone-auto" not in tokyo
    assert re.findall(r"data-viewer-time>([^<]+)<", tokyo)[0] == "2026-03-27 21:00:00 JST"
    assert re.findall(r"data-schedule-time>([^<]+)<", tokyo)[0] == "2026-03-27 13:00:00 CET"
    refused = pages.client.get("/admin/schedules", params={"tz": "Mars/Olympus"})
    assert refused.status_code == 422 and "unknown IANA timezone" in refused.text
    assert pages.client.get("/admin/schedules/nope").status_code == 404
    assert pages.client.get("/admin/schedules/tick", params={"outcome": "exploded"}).status_code == 422


def test_the_page_of_a_schedule_declared_in_code_says_where_and_offers_no_edit_or_delete(pages):
    from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
    from outboxkit.schedules.store import ScheduleStore

    declared = ScheduleDefinition(name="nightly", trigger=ScheduleTrigger.cron(hour=3), target=JobTarget(job="record"))
    ScheduleStore(pages.engine, clock=pages.kit.clock, jobs=["record"]).sync_from_code(
        [declared], origins={"nightly": "shop.schedules:12"})
    page = html.unescape(pages.client.get("/admin/schedules/nightly").text)
    words = re.sub(r"<[^>]+>", "", page)
    assert "declared in code at shop.schedules:12; change it there" in words
    assert "/admin/schedules/nightly/edit" not in page and "/admin/schedules/nightly/delete" not in page
    assert 'data-action="run_now"' in page and 'data-action="disable"' in page
    listing = html.unescape(pages.client.get("/admin/schedules").text)
    assert "/admin/schedules/nightly/edit" not in listing

    before = rows(pages)
    for refused in (pages.client.get("/admin/schedules/nightly/edit"),
                    pages.client.post("/admin/schedules/nightly/edit", data={**FORM, "csrf_token": token(pages)}),
                    pages.client.get("/admin/schedules/nightly/delete"),
                    pages.client.post("/admin/schedules/nightly/delete", data={"csrf_token": token(pages)})):
        assert refused.status_code == 409 and "declared in code at shop.schedules:12" in html.unescape(refused.text)
    assert rows(pages) == before
