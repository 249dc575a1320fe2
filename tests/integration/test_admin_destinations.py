"""The admin's destinations: the JSON API and the pages over the real database (the browser tests drive the same
pages in Chromium).  Every action is audited with the signed-in actor; bad input changes nothing."""

from __future__ import annotations

import re

import pytest

from outboxkit.breaker import Signal
from outboxkit.errors import UnknownDestinationError
from outboxkit.operations.destinations import DestinationOperations
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    row_of,
    snapshot,
)
from tests.support.destinations import DEAD, destination_row, open_breaker, record

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def test_the_api_lists_every_destination_of_every_outbox_with_its_state(admin):
    state = open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=START)
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START, target_url="https://partner.example/in")
    listed = admin.client.get("/admin/api/destinations").json()
    by_outbox = {entry["outbox"]: entry for entry in listed["outboxes"]}
    (dead,) = by_outbox["webhooks"]["destinations"]
    assert by_outbox["credit-grants"]["destinations"] == [] and by_outbox["webhooks"]["complete"] is True
    assert {key: dead[key] for key in ("name", "status", "consecutive_failures", "failure_rate", "last_status_code",
                                       "waiting_rows", "waiting_rows_at_least")} == {
        "name": DEAD, "status": "open", "consecutive_failures": 3, "failure_rate": 1.0, "last_status_code": 503,
        "waiting_rows": 2, "waiting_rows_at_least": False}
    assert dead["open_since"] == "2030-01-01T12:00:00Z" and dead["next_probe_at"] == "2030-01-01T12:00:30Z"
    assert admin.client.get("/admin/api/outboxes/webhooks/destinations").json()["destinations"] == [dead]
    assert admin.client.get("/admin/api/outboxes/webhooks/destination", params={"name": DEAD}).json() == dead
    assert dead["waiting_until"] == state.next_probe_at.isoformat().replace("+00:00", "Z")  # when they may go again


def test_the_api_actions_are_audited_with_the_actor_and_say_when_nothing_changed(admin):
    open_breaker(admin.engine, at=START)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    probed = admin.client.post("/admin/api/outboxes/webhooks/destinations/probe", json={"destination": DEAD})
    disabled = admin.client.post("/admin/api/outboxes/webhooks/destinations/disable", json={"destination": DEAD})
    again = admin.client.post("/admin/api/outboxes/webhooks/destinations/disable", json={"destination": DEAD})
    resumed = admin.client.post("/admin/api/outboxes/webhooks/destinations/resume", json={"destination": DEAD})
    assert [response.status_code for response in (probed, disabled, again, resumed)] == [200] * 4
    assert (probed.json()["changed"], probed.json()["status"], probed.json()["released_rows"]) == (True, "open", 1)
    assert (disabled.json()["status"], again.json()["changed"], again.json()["audit_id"]) == ("disabled", False, None)
    assert (resumed.json()["status"], resumed.json()["released_rows"]) == ("healthy", 1)
    assert row_of(admin.engine, row_id)["next_attempt_at"] == START
    entries = audit_entries(admin.engine)
    assert [(entry["action"], entry["actor"], entry["filter"]["destination"]) for entry in entries] == [
        ("destination_probe", "admin", DEAD), ("destination_disable", "admin", DEAD), ("destination_resume", "admin", DEAD)]
    assert [entry["id"] for entry in entries] == [probed.json()["audit_id"], disabled.json()["audit_id"],
                                                 resumed.json()["audit_id"]]


def test_the_api_refuses_an_unknown_destination_or_outbox_and_a_malformed_body_and_changes_nothing(admin):
    open_breaker(admin.engine, at=START)
    before = snapshot(admin.engine), destination_row(admin.engine)
    client = admin.client
    unknown = client.post("/admin/api/outboxes/webhooks/destinations/resume", json={"destination": "http://nowhere:1"})
    assert unknown.status_code == 404 and "has no destination 'http://nowhere:1'" in unknown.json()["detail"]
    assert client.post("/admin/api/outboxes/nope/destinations/resume", json={"destination": DEAD}).status_code == 404
    assert client.post("/admin/api/outboxes/webhooks/destinations/resume", content=DEAD).status_code == 415
    for body in ({}, {"destination": ""}, {"destination": 7}, {"destination": "x" * 301}, {"destination": DEAD, "x": 1}):
        assert client.post("/admin/api/outboxes/webhooks/destinations/disable", json=body).status_code == 422, body
    assert client.get("/admin/api/outboxes/webhooks/destination", params={"name": "http://nowhere:1"}).status_code == 404
    assert client.get("/admin/api/outboxes/webhooks/destination").status_code == 422
    assert client.get("/admin/api/outboxes/nope/destinations").status_code == 404
    assert (snapshot(admin.engine), destination_row(admin.engine)) == before


def test_the_pages_list_a_destination_link_its_rows_waiting_and_act_with_csrf(admin):
    open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=START)
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START, target_url="https://partner.example/in")
    listing = admin.client.get("/admin/destinations").text
    assert 'href="/admin/destinations"' in listing and f'data-destination="{DEAD}"' in listing
    assert "badge-destination-open" in listing and "503" in listing
    page = admin.client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD})
    assert page.status_code == 200 and 'data-action="resume"' in page.text and 'data-action="probe"' in page.text
    assert re.search(r'<dd id="waiting-rows">2 <span', page.text)  # its two rows the claim leaves out

    token = TOKEN.search(page.text).group(1)
    forged = admin.client.post("/admin/outboxes/webhooks/destination/resume", data={"destination": DEAD, "csrf_token": "x"})
    assert forged.status_code == 403 and destination_row(admin.engine)["status"] == "open"
    confirm = admin.client.get("/admin/outboxes/webhooks/destination/disable", params={"name": DEAD})
    assert confirm.status_code == 200 and "Disable destination" in confirm.text and "2 row(s) waiting" in confirm.text
    assert destination_row(admin.engine)["status"] == "open"  # asking changed nothing
    disabled = admin.client.post("/admin/outboxes/webhooks/destination/disable", data={"destination": DEAD, "csrf_token": token})
    assert disabled.status_code == 303 and destination_row(admin.engine)["status"] == "disabled"
    shown = admin.client.get(disabled.headers["location"]).text
    assert "Disabled: nothing is sent to this destination" in shown and "badge-destination-disabled" in shown
    resumed = admin.client.post("/admin/outboxes/webhooks/destination/resume", data={"destination": DEAD, "csrf_token": token})
    assert "2 row(s) it held back may go now" in admin.client.get(resumed.headers["location"]).text
    again = admin.client.post("/admin/outboxes/webhooks/destination/probe", data={"destination": DEAD, "csrf_token": token})
    assert "Nothing to do: the destination" in admin.client.get(again.headers["location"]).text
    audit = admin.client.get("/admin/audit").text
    assert "destination_disable" in audit and "destination_resume" in audit and f"destination=<bdi>{DEAD}</bdi>" in audit
    assert [entry["actor"] for entry in audit_entries(admin.engine)] == ["admin", "admin"]


def test_the_pages_answer_an_unknown_destination_and_a_missing_name_with_the_error_page(admin):
    record(admin.engine, Signal.FAILURE, at=START)
    token = TOKEN.search(admin.client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD}).text).group(1)
    before = snapshot(admin.engine), destination_row(admin.engine)
    missing = admin.client.get("/admin/outboxes/webhooks/destination", params={"name": "http://nowhere:1"})
    assert missing.status_code == 404 and "has no destination" in missing.text
    assert admin.client.get("/admin/outboxes/nope/destination", params={"name": DEAD}).status_code == 404
    posted = admin.client.post("/admin/outboxes/webhooks/destination/disable",
                               data={"destination": "http://nowhere:1", "csrf_token": token})
    empty = admin.client.post("/admin/outboxes/webhooks/destination/resume", data={"csrf_token": token})
    assert posted.status_code == 404 and empty.status_code == 422 and "bad form: destination" in empty.text
    assert (snapshot(admin.engine), destination_row(admin.engine)) == before


def test_a_destination_name_postgresql_cannot_hold_is_a_clear_404_everywhere_and_changes_nothing(admin):
    open_breaker(admin.engine, at=START)
    token = TOKEN.search(admin.client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD}).text).group(1)
    before = snapshot(admin.engine), destination_row(admin.engine)
    for action in ("resume", "disable", "probe"):
        for name in (DEAD + "\x00", "\x00"):
            api = admin.client.post(f"/admin/api/outboxes/webhooks/destinations/{action}", json={"destination": name})
            assert api.status_code == 404 and "has no destination" in api.json()["detail"], (action, name)
        page = admin.client.post(f"/admin/outboxes/webhooks/destination/{action}",
                                 data={"destination": DEAD + "\x00", "csrf_token": token})
        assert page.status_code == 404 and "has no destination" in page.text, action
    assert admin.client.get("/admin/api/outboxes/webhooks/destination", params={"name": DEAD + "\x00"}).status_code == 404
    assert admin.client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD + "\x00"}).status_code == 404
    operations = DestinationOperations(admin.kit)  # the CLI's way in: a lone surrogate can come from argv
    for perform in (operations.resume, operations.disable, operations.probe):
        with pytest.raises(UnknownDestinationError):
            perform("webhooks", "http://a\ud800:1", actor="admin")
    assert (snapshot(admin.engine), destination_row(admin.engine)) == before


def test_the_overview_counts_rows_held_by_destinations_and_lists_the_unhealthy_first(admin):
    open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=START)
    slowed = "https://partner.example:443"
    record(admin.engine, Signal.THROTTLED, at=START, destination=slowed, status_code=429, slow_down=600)
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START, target_url="https://partner.example/in")
    record(admin.engine, Signal.SUCCESS, at=START, destination="https://fine.example:443")
    admin.client.post("/admin/api/outboxes/webhooks/destinations/disable", json={"destination": DEAD})

    overview = admin.client.get("/admin/api/outboxes").json()
    page = admin.client.get("/admin/").text

    webhooks = next(box for box in overview["outboxes"] if box["name"] == "webhooks")
    assert (webhooks["counts"]["pending"], webhooks["held_by_destination"]) == (3, 3)
    assert [(entry["destination"], entry["state"], entry["waiting_rows"], entry["until"] is None)
            for entry in overview["held_back"]] == [(DEAD, "disabled", 2, True), (slowed, "slowed", 1, False)]
    assert page.index('id="held-back"') < page.index("<th>Outbox</th>")
    assert "https://fine.example:443" not in page


def test_the_audit_counts_the_rows_a_resume_released(admin):
    open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 8, status="pending", next_attempt_at=START)

    resumed = admin.client.post("/admin/api/outboxes/webhooks/destinations/resume", json={"destination": DEAD}).json()

    (entry,) = audit_entries(admin.engine)
    assert resumed["released_rows"] == 8 and entry["row_count"] == 8
    assert admin.client.get("/admin/api/audit").json()["entries"][0]["row_count"] == 8
    assert re.search(r"destination_resume.*?\b8\b", admin.client.get("/admin/audit").text, re.S)
