"""Errors found in the admin (issue 19, section 2): each answered clearly, with the admin's page or JSON and its headers."""

from __future__ import annotations

import logging
import re
import threading
from datetime import timedelta

import psycopg
import pytest
from exampleapp.models import CreditGrantOutbox, WebhookOutbox
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.admin import JobInfo, create_admin_router
from outboxkit.errors import ConfigurationError
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    record_run,
    row_of,
    snapshot,
)
from tests.support.receiver import Reply

SECURITY_HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy")


def assert_admin_error_page(response, status_code: int) -> None:
    assert response.status_code == status_code
    assert response.headers["content-type"].startswith("text/html")
    assert '<p class="alert alert-error" role="alert">' in response.text
    assert all(name in response.headers for name in SECURITY_HEADERS), response.headers


class ListedJobs:
    """A job source that lists the given ids (a scheduler other than the kit's may allow any characters)."""

    def __init__(self, *ids: str) -> None:
        self.ids = ids

    def jobs(self) -> list[JobInfo]:
        return [JobInfo(id=job_id, name=job_id, trigger="") for job_id in self.ids]


def test_job_ids_with_a_slash_or_a_question_mark_are_listed_linked_and_opened(admin):
    for job_id in ("reports/daily", "sync?x=1"):
        record_run(admin.engine, job_id, job_id, START, counts={"rows": 3})
    app = FastAPI()
    app.include_router(
        create_admin_router(admin.kit, insecure_no_auth=True, job_source=ListedJobs("reports/daily", "sync?x=1")),
        prefix="/admin",
    )
    with TestClient(app) as client:
        schedules = client.get("/admin/schedules")
        assert schedules.status_code == 200
        links = ("/admin/schedules/_internal/reports%2Fdaily", "/admin/schedules/_internal/sync%3Fx%3D1")
        assert all(f'href="{link}"' in schedules.text for link in links)
        for link, job_id in zip(links, ("reports/daily", "sync?x=1"), strict=True):
            page = client.get(link)
            assert page.status_code == 200 and f"Internal job <code>{job_id}</code>" in page.text
            runs = client.get(link.replace("/admin/schedules/", "/admin/api/schedules/") + "/runs").json()
            assert runs["job_id"] == job_id and len(runs["runs"]) == 1


def test_links_follow_the_mount_of_the_admin_and_keep_braces_in_a_job_id(admin):
    # The page frame looks each route's path up once per request and fills in the parameters: the path
    # must be the one of the mount this request came through, and a parameter's "{" or "}" stays data.
    record_run(admin.engine, "sync{x}", "sync{x}", START, counts={"rows": 1})
    source = ListedJobs("sync{x}")
    included = FastAPI()
    included.include_router(create_admin_router(admin.kit, insecure_no_auth=True, job_source=source), prefix="/ops")
    inner = FastAPI()
    inner.include_router(create_admin_router(admin.kit, insecure_no_auth=True, job_source=source))
    mounted = FastAPI()
    mounted.mount("/team/console", inner)
    for app, base in ((included, "/ops"), (mounted, "/team/console")):
        with TestClient(app, follow_redirects=False) as client:
            schedules = client.get(f"{base}/schedules")
            assert schedules.status_code == 200
            assert f'href="{base}/schedules/_internal/sync%7Bx%7D"' in schedules.text
            assert f'href="{base}/outboxes/webhooks"' in schedules.text
            assert client.get(f"{base}/schedules/_internal/sync%7Bx%7D").status_code == 200
            old = client.get(f"{base}/jobs/sync%7Bx%7D")  # an old bookmark
            assert old.headers["location"] == f"{base}/schedules/_internal/sync%7Bx%7D"


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59"])
def test_a_filter_time_at_the_ends_of_the_calendar_is_answered_on_the_page_and_the_api(admin, moment):
    add_webhooks(admin.engine, 2, status="stuck")
    for field in ("created_after", "updated_before"):
        page = admin.client.get("/admin/outboxes/webhooks", params={"status": "stuck", field: moment})
        api = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"status": "stuck", field: moment})
        assert (page.status_code, api.status_code) == (200, 200)
        expected = 0 if (field == "created_after") == moment.startswith("9999") else 2
        assert len(api.json()["rows"]) == expected
        assert page.text.count('name="ids"') == expected


@pytest.mark.parametrize("value", ["0.5", "0", "1700000000", "20300101", "-1e3"])
def test_the_api_refuses_numbers_as_times(admin, value):
    response = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"updated_before": value})
    assert response.status_code == 422
    assert "ISO 8601" in response.text and "updated_before" in response.text


def test_the_api_takes_iso_8601_times_with_and_without_an_offset(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    for value in ("2999-01-01T00:00:00Z", "2999-01-01T00:00:00", "2999-01-01T01:00:00+01:00"):
        rows = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"updated_before": value}).json()["rows"]
        assert [row["id"] for row in rows] == [row_id]


def test_a_bad_path_parameter_on_a_page_gets_the_html_error_page(admin):
    for path in ("/admin/outboxes/webhooks/rows/abc", "/admin/outboxes/webhooks/rows/0", "/admin/outboxes/webhooks/rows/1.5"):
        response = admin.client.get(path)
        assert_admin_error_page(response, 422)
        assert "row_id" in response.text
    assert admin.client.get("/admin/api/outboxes/webhooks/rows/abc").headers["content-type"] == "application/json"


def _broken_actor() -> str:
    raise RuntimeError("the actor lookup is broken")


def test_an_unexpected_error_gets_the_error_page_or_json_with_the_headers_and_is_logged(admin, caplog):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    app = FastAPI()
    app.include_router(
        create_admin_router(admin.kit, dependencies=[Depends(lambda: None)], actor=_broken_actor), prefix="/admin"
    )
    caplog.set_level(logging.ERROR, logger="outboxkit.admin")
    with TestClient(app, raise_server_exceptions=False) as client:
        page = client.get("/admin/")
        api = client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    assert_admin_error_page(page, 500)
    assert "Something went wrong" in page.text and "the actor lookup is broken" not in page.text
    assert api.status_code == 500 and api.headers["content-type"] == "application/json"
    assert "unexpected error" in api.json()["detail"]
    assert all(name in api.headers for name in SECURITY_HEADERS)
    records = [record for record in caplog.records if getattr(record, "event_name", None) == "admin.unexpected_error"]
    assert len(records) == 2 and all("the actor lookup is broken" in str(record.exc_info[1]) for record in records)
    assert snapshot(admin.engine) == before


def test_the_leader_is_the_holder_of_the_kits_lock_key_not_any_session_named_like_a_leader(admin, admin_database_url):
    key = admin.kit.settings.advisory_lock_key
    with (
        psycopg.connect(admin_database_url, autocommit=True, application_name="outboxkit-leader:intruder:1") as foreign,
        psycopg.connect(admin_database_url, autocommit=True, application_name="outboxkit-leader:host-a:4242") as leader,
    ):
        foreign.execute("SELECT pg_advisory_lock(424242)")  # another application's lock, under a look-alike name
        assert admin.client.get("/admin/api/outboxes").json()["leaders"] == []
        leader.execute("SELECT pg_advisory_lock(%s::bigint)", (key,))
        for path in ("/admin/api/outboxes", "/admin/api/jobs"):
            view = admin.client.get(path).json()
            assert [(found["host"], found["pid"]) for found in view["leaders"]] == [("host-a", 4242)]
        page = admin.client.get("/admin/")
        assert "sessions hold the leader lock" not in page.text and "host-a" in page.text
        leader.execute("SELECT pg_advisory_unlock(%s::bigint)", (key,))


def test_drain_now_clicks_share_one_background_drain_per_outbox(admin, receiver):
    receiver.respond = lambda request: Reply(status=200, hang=True)
    ids = add_webhooks(
        admin.engine, 3, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook",
        next_attempt_at=START - timedelta(minutes=1),
    )
    assert not admin.kit.drainer("webhooks").running  # the example app runs no drain loop: drain now drains here
    answers = [admin.client.post("/admin/api/outboxes/webhooks/drain-now", json={}) for _ in range(30)]
    assert {answer.status_code for answer in answers} == {200}
    receiver.wait_for(lambda found: found.in_flight >= 1)
    threads = [thread for thread in threading.enumerate() if thread.name == "outboxkit-drain-now-webhooks"]
    assert len(threads) == 1
    receiver.release()
    threads[0].join(timeout=60)
    assert not threads[0].is_alive()
    assert {row_of(admin.engine, row_id)["status"] for row_id in ids} == {"done"}
    assert sorted(receiver.count_by_key().values()) == [1, 1, 1]  # each row sent once


def test_insecure_no_auth_is_refused_in_production(admin):
    kit = OutboxKit(admin.engine, [CreditGrantOutbox, WebhookOutbox], settings=OutboxKitSettings(environment="production"))
    try:
        with pytest.raises(ConfigurationError, match="production"):
            create_admin_router(kit, insecure_no_auth=True)
        assert create_admin_router(kit, dependencies=[Depends(lambda: None)]) is not None
    finally:
        kit.close()


def test_the_error_page_names_the_bad_field_for_a_malformed_job_id(admin):
    for path in ("/admin/schedules/_internal/", "/admin/jobs/"):  # the old page's URL too
        response = admin.client.get(path + "x" * 201)
        assert_admin_error_page(response, 422)
        assert re.search(r"bad job_id", response.text)


TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
HIDDEN = re.compile(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">')


def confirm_form(page_text: str) -> tuple[str, list[tuple[str, str]]]:
    """The confirmation page's form: where it posts and its fields (the CSRF token included)."""
    form = page_text[page_text.index('<form method="post"') :]
    form = form[: form.index("</form>")]
    action = re.search(r'action="([^"]+)"', form).group(1)
    return action, HIDDEN.findall(form)


def test_pause_drains_asks_first_on_a_page_that_works_without_script(admin):
    rows_page = admin.client.get("/admin/outboxes/webhooks").text
    assert '<form method="get" action="/admin/outboxes/webhooks/pause"' in rows_page
    confirm = admin.client.get("/admin/outboxes/webhooks/pause")
    assert confirm.status_code == 200 and "Pause the drains of webhooks?" in confirm.text
    assert admin.client.get("/admin/api/jobs").json()["jobs"][0]["paused"] is False  # asking changed nothing
    action, fields = confirm_form(confirm.text)
    assert action == "/admin/outboxes/webhooks/pause"
    done = admin.client.post(action, data=dict(fields))
    assert done.status_code == 303 and done.headers["location"] == "/admin/outboxes/webhooks"
    assert admin.client.get("/admin/api/outboxes").json()["outboxes"][1]["paused"] is True
    forged = admin.client.post(action, data={})  # the confirmation's form is CSRF-protected
    assert forged.status_code == 403


def test_reset_all_on_the_page_asks_first_listing_the_ids(admin):
    ids = add_webhooks(admin.engine, 3, status="stuck")
    page = admin.client.get("/admin/outboxes/webhooks", params={"status": "stuck"}).text
    assert 'formaction="/admin/outboxes/webhooks/reset-page"' in page
    token = TOKEN.search(page).group(1)
    before = snapshot(admin.engine)
    confirm = admin.client.post(
        "/admin/outboxes/webhooks/reset-page",
        data={"csrf_token": token, "scope": "page", "page_ids": [str(row_id) for row_id in ids]},
    )
    assert confirm.status_code == 200 and "Reset 3 row(s) of webhooks?" in confirm.text
    assert snapshot(admin.engine) == before
    action, fields = confirm_form(confirm.text)
    assert action == "/admin/outboxes/webhooks/reset-selected"
    assert [value for name, value in fields if name == "page_ids"] == [str(row_id) for row_id in ids]
    data: dict[str, list[str]] = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    done = admin.client.post(action, data=data)
    assert done.status_code == 303
    assert {row_of(admin.engine, row_id)["status"] for row_id in ids} == {"pending"}
    refused = admin.client.post("/admin/outboxes/webhooks/reset-page", data={"page_ids": [str(ids[0])]})
    assert refused.status_code == 403


def test_drain_now_while_paused_is_offered_and_asks_to_resume_first(admin):
    admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    assert admin.client.post("/admin/api/outboxes/webhooks/drain-now", json={}).status_code == 409  # the API refuses
    page = admin.client.get("/admin/outboxes/webhooks").text
    assert '<form method="get" action="/admin/outboxes/webhooks/drain-now"' in page and "Drain now…" in page
    confirm = admin.client.get("/admin/outboxes/webhooks/drain-now")
    assert confirm.status_code == 200 and "webhooks is paused: resume and drain now?" in confirm.text
    action, fields = confirm_form(confirm.text)
    assert action == "/admin/outboxes/webhooks/resume-and-drain-now"
    done = admin.client.post(action, data=dict(fields))
    assert done.status_code == 303
    assert "Resumed, and woke every drain" in admin.client.get(done.headers["location"]).text
    entries = admin.client.get("/admin/api/audit").json()["entries"]
    assert [entry["action"] for entry in entries] == ["drain_now", "resume", "pause"]
