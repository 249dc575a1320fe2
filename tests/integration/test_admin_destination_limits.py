"""The admin's destination limits: the JSON API and the form on a destination's page, over the real database (the
browser test drives the form in Chromium).  Each change is audited with the signed-in actor; bad input, an unknown
destination and a forged form change nothing."""

from __future__ import annotations

import re

from sqlalchemy import text

from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
)
from tests.support.destinations import DEAD, open_breaker

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
LIMITS = "/admin/api/outboxes/webhooks/destinations/limits"


def stored(engine) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT destination, per_second, cap, updated_by FROM outboxkit_destination_limits ORDER BY destination"))]


def test_the_api_reads_sets_and_clears_a_destinations_limits_audited_with_the_actor(admin):
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)  # known by its pending row, no state
    client = admin.client
    shown = client.get("/admin/api/outboxes/webhooks/destination/limits", params={"name": DEAD})
    assert shown.status_code == 200 and shown.json() == {
        "outbox": "webhooks", "destination": DEAD, "per_second": None, "cap": None, "default_per_second": None,
        "default_cap": 8, "updated_by": None, "updated_at": None}
    set_both = client.post(LIMITS, json={"destination": DEAD, "per_second": 2.5, "cap": 4})
    assert set_both.status_code == 200
    assert (set_both.json()["changed"], set_both.json()["limits"]["per_second"], set_both.json()["limits"]["cap"]) == (
        True, 2.5, 4)
    assert stored(admin.engine) == [(DEAD, 2.5, 4, "admin")]
    same = client.post(LIMITS, json={"destination": DEAD, "per_second": 2.5, "cap": 4}).json()
    assert (same["changed"], same["audit_id"]) == (False, None)
    cleared = client.post(LIMITS, json={"destination": DEAD}).json()  # both left out: the outbox's own
    assert (cleared["changed"], cleared["action"], cleared["limits"]["per_second"]) == (True, "destination_limit_clear", None)
    assert stored(admin.engine) == []
    entries = audit_entries(admin.engine)
    assert [(entry["action"], entry["actor"], entry["filter"]["cap_after"]) for entry in entries] == [
        ("destination_limit", "admin", 4), ("destination_limit_clear", "admin", None)]
    assert [entry["id"] for entry in entries] == [set_both.json()["audit_id"], cleared["audit_id"]]


def test_the_api_refuses_bad_values_an_unknown_destination_or_outbox_and_changes_nothing(admin):
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    client = admin.client
    for body in [{"per_second": 0}, {"per_second": -1}, {"per_second": "5"}, {"cap": 0}, {"cap": 1.5}, {"cap": "2"},
                 {"cap": True}, {"per_second": 2_000_000}, {"cap": 10_001}, {"rate": 5}]:
        answer = client.post(LIMITS, json={"destination": DEAD, **body})
        assert answer.status_code == 422, (body, answer.text)
    unknown = client.post(LIMITS, json={"destination": "https://nowhere.example:443", "per_second": 1})
    assert unknown.status_code == 404 and "has no destination 'https://nowhere.example:443'" in unknown.json()["detail"]
    assert client.post("/admin/api/outboxes/nope/destinations/limits", json={"destination": DEAD, "cap": 1}).status_code == 404
    form = client.post(LIMITS, data={"destination": DEAD, "cap": "1"})  # not JSON: the API's CSRF guard
    assert form.status_code == 415
    assert client.get("/admin/api/outboxes/webhooks/destination/limits",
                      params={"name": "https://nowhere.example:443"}).status_code == 404
    assert stored(admin.engine) == [] and audit_entries(admin.engine) == []


def test_the_form_on_a_destinations_page_sets_and_clears_with_csrf_and_refuses_a_bad_value(admin):
    open_breaker(admin.engine, at=START)
    client = admin.client
    page = client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD})
    assert page.status_code == 200 and 'id="destination-limits"' in page.text and 'data-action="limits"' in page.text
    token = TOKEN.search(page.text).group(1)
    url = "/admin/outboxes/webhooks/destination/limits"
    forged = client.post(url, data={"destination": DEAD, "per_second": "3", "cap": "", "csrf_token": "x"})
    assert forged.status_code == 403 and stored(admin.engine) == []
    for per_second, cap, message in [("fast", "", "rate limit (requests per second) must be a number"),
                                     ("-1", "", "rate limit must be more than 0"), ("", "0", "cap must be from 1"),
                                     ("", "2.5", "cap (sends in flight) must be a whole number")]:
        bad = client.post(url, data={"destination": DEAD, "per_second": per_second, "cap": cap, "csrf_token": token})
        assert bad.status_code == 422 and message in bad.text, (per_second, cap)
    assert stored(admin.engine) == []
    saved = client.post(url, data={"destination": DEAD, "per_second": "3", "cap": "2", "csrf_token": token})
    assert saved.status_code == 303 and stored(admin.engine) == [(DEAD, 3.0, 2, "admin")]
    shown = client.get(saved.headers["location"]).text
    assert "Limits saved" in shown and 'name="per_second" value="3"' in shown and 'name="cap" value="2"' in shown
    cleared = client.post(url, data={"destination": DEAD, "per_second": "", "cap": "", "csrf_token": token})
    assert "Limits cleared" in client.get(cleared.headers["location"]).text and stored(admin.engine) == []
    assert [entry["action"] for entry in audit_entries(admin.engine)] == ["destination_limit", "destination_limit_clear"]


def test_a_destination_that_never_failed_has_a_page_with_its_limits_and_no_state_actions(admin):
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    page = admin.client.get("/admin/outboxes/webhooks/destination", params={"name": DEAD})
    assert page.status_code == 200 and 'id="destination-limits"' in page.text
    assert 'data-action="disable"' not in page.text and 'data-action="resume"' not in page.text
    api = admin.client.get("/admin/api/outboxes/webhooks/destination", params={"name": DEAD}).json()
    assert (api["status"], api["stored"]) == ("healthy", False)
