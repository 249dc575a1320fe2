"""The admin pages over HTTP: rendering, escaping, ages, CSRF, and bad input on pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from outboxkit.admin import CSRF_COOKIE
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    cookie_named,
    record_run,
    row_of,
    snapshot,
)

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def _token(page) -> str:
    match = TOKEN.search(page.text)
    assert match, "the page has no CSRF field"
    return match.group(1)


def test_overview_shows_counts_ages_with_exact_utc_titles_and_the_done_label(admin):
    now = admin.clock.now()
    add_webhooks(admin.engine, 2, status="stuck")
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=now - timedelta(minutes=3))
    record_run(admin.engine, "outboxkit.drain.webhooks", "drain webhooks", now - timedelta(minutes=5))
    page = admin.client.get("/admin/")
    assert page.status_code == 200
    assert '<time datetime="2030-01-01T11:57:00+00:00" title="2030-01-01 11:57:00 UTC">3 min ago</time>' in page.text
    assert 'title="2030-01-01 11:55:00 UTC">5 min ago</time>' in page.text
    assert 'href="/admin/static/admin.css"' in page.text
    assert "Leader: none" in page.text


def test_a_hostile_payload_renders_escaped_isolated_and_truncated(admin):
    hostile = "<script>alert(1)</script>\u202eevil\u202c" + "z" * 1_000_000
    (row_id,) = add_webhooks(admin.engine, 1, payload={"note": hostile}, error="<img src=x onerror=alert(2)>")
    detail = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    assert detail.status_code == 200
    assert "<script>alert(1)" not in detail.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in detail.text
    assert "<img src=x" not in detail.text and "&lt;img src=x onerror=alert(2)&gt;" in detail.text
    assert "\u202e" not in detail.text and "⟨U+202E⟩evil⟨U+202C⟩" in detail.text
    assert "Shown: the first 10,000 of" in detail.text
    assert len(detail.content) < 40_000

    listing = admin.client.get("/admin/outboxes/webhooks")
    assert "&lt;img src=x onerror=alert(2)&gt;" in listing.text
    assert "zzzz" not in listing.text and len(listing.content) < 20_000


def test_rows_page_has_status_tabs_filter_and_pagination(admin):
    add_webhooks(admin.engine, 3, status="stuck", error="timeout")
    add_webhooks(admin.engine, 1, status="stuck", error="HTTP 400")
    page = admin.client.get("/admin/outboxes/webhooks", params={"error_contains": "timeout"})
    assert page.status_code == 200
    assert page.text.count('name="ids"') == 3
    assert re.search(r'class="tab active"[^>]*>stuck <span class="count">3</span>', page.text)  # counts follow the filter
    assert 'value="timeout"' in page.text


def test_reset_from_the_row_page_with_the_csrf_token(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck", attempts=4)
    detail = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    assert cookie_named(admin.client, CSRF_COOKIE).value == _token(detail)

    response = admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(detail)})

    assert response.status_code == 303
    assert response.headers["location"] == f"/admin/outboxes/webhooks/rows/{row_id}"
    assert row_of(admin.engine, row_id)["status"] == "pending"
    after = admin.client.get(response.headers["location"])
    assert "Reset: the row is pending and due now" in after.text
    assert audit_entries(admin.engine)[-1]["actor"] == "admin"


@pytest.mark.parametrize("forgery", ["missing", "other_cookie", "unsigned", "get"])
def test_a_post_without_a_valid_csrf_token_is_refused_and_changes_nothing(admin, forgery):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    token = _token(admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}"))
    before = snapshot(admin.engine)
    url = f"/admin/outboxes/webhooks/rows/{row_id}/reset"
    if forgery == "missing":
        response = admin.client.post(url, data={})
    elif forgery == "other_cookie":
        response = admin.client.post(url, data={"csrf_token": token + "x"})
    elif forgery == "unsigned":
        cookie = cookie_named(admin.client, CSRF_COOKIE)
        admin.client.cookies.set(cookie.name, "abc.def", domain=cookie.domain, path=cookie.path)
        response = admin.client.post(url, data={"csrf_token": "abc.def"})
    else:
        response = admin.client.get(url)
    assert response.status_code == (405 if forgery == "get" else 403)
    assert snapshot(admin.engine) == before


def test_retry_now_from_the_row_page(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=admin.clock.now() + timedelta(hours=1))
    detail = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    assert "Retry now" in detail.text and "Reset this row" not in detail.text
    response = admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/retry-now", data={"csrf_token": _token(detail)})
    assert response.status_code == 303
    assert row_of(admin.engine, row_id)["next_attempt_at"] == admin.clock.now()


def test_a_held_row_is_refused_on_the_page_with_409(admin):
    lease = admin.clock.now() + timedelta(minutes=1)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=lease, claimed_until=lease)
    detail = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    assert "in flight: a drain holds it" in detail.text
    assert "Retry now" not in detail.text
    before = snapshot(admin.engine)
    # A form rendered before the drain claimed the row, submitted now.
    token = cookie_named(admin.client, CSRF_COOKIE).value
    response = admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/retry-now", data={"csrf_token": token})
    assert response.status_code == 409 and "holds" in response.text
    assert snapshot(admin.engine) == before


def test_bulk_reset_shows_the_dry_run_count_before_it_resets(admin):
    matching = add_webhooks(admin.engine, 3, status="stuck", error="HTTP 400: bad amount")
    other = add_webhooks(admin.engine, 2, status="stuck", error="HTTP 404")
    before = snapshot(admin.engine)
    confirm = admin.client.get("/admin/outboxes/webhooks/bulk-reset", params={"error_contains": "bad amount"})
    assert re.search(r"<strong>3</strong> stuck row\(s\) match now", confirm.text)
    assert snapshot(admin.engine) == before

    response = admin.client.post(
        "/admin/outboxes/webhooks/bulk-reset",
        data={"csrf_token": _token(confirm), "error_contains": "bad amount", "status_code": ""},
    )
    assert response.status_code == 303
    assert {row_of(admin.engine, row_id)["status"] for row_id in matching} == {"pending"}
    assert {row_of(admin.engine, row_id)["status"] for row_id in other} == {"stuck"}
    assert "Reset 3 row(s)" in admin.client.get(response.headers["location"]).text


def test_reset_selected_rows(admin):
    ids = add_webhooks(admin.engine, 3, status="stuck")
    page = admin.client.get("/admin/outboxes/webhooks")
    response = admin.client.post(
        "/admin/outboxes/webhooks/reset-selected", data={"csrf_token": _token(page), "ids": [str(ids[0]), str(ids[2])]}
    )
    assert response.status_code == 303
    assert [row_of(admin.engine, row_id)["status"] for row_id in ids] == ["pending", "stuck", "pending"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/admin/outboxes/nope", 404),
        ("/admin/outboxes/webhooks?status=lost", 422),
        ("/admin/outboxes/webhooks?status_code=abc", 422),
        ("/admin/outboxes/webhooks?error_contains=a%00b", 422),
        ("/admin/outboxes/webhooks?cursor=%25%25", 400),
        ("/admin/outboxes/webhooks/rows/abc", 422),
        ("/admin/outboxes/webhooks/rows/999999", 404),
        ("/admin/outboxes/webhooks/bulk-reset?status_code=1000", 422),
        ("/admin/audit?cursor=zzz", 400),
        ("/admin/audit?outbox=nope", 404),
        ("/admin/static/secrets.txt", 404),
        # Unicode digits ("²".isdigit() is true in Python) and other non-ASCII input.
        ("/admin/outboxes/webhooks?status_code=²", 422),
        ("/admin/outboxes/webhooks?status_code=４００", 422),
        ("/admin/outboxes/webhooks?status_code=4_00", 422),
        ("/admin/outboxes/webhooks?status=stück", 422),
        ("/admin/outboxes/webhooks?cursor=²", 400),
        ("/admin/outboxes/%E2%80%AEevil", 404),
        ("/admin/outboxes/webhooks/rows/²", 422),
        ("/admin/outboxes/webhooks/rows/١", 422),
        ("/admin/outboxes/webhooks/bulk-reset?status_code=³", 422),
        ("/admin/audit?outbox=ü&cursor=²", 404),
        ("/admin/audit?cursor=²", 400),
    ],
)
def test_bad_page_input_gets_a_clear_4xx(admin, path, expected):
    assert admin.client.get(path).status_code == expected


def test_bad_form_input_gets_a_clear_4xx_and_changes_nothing(admin):
    add_webhooks(admin.engine, 2, status="stuck")
    token = _token(admin.client.get("/admin/outboxes/webhooks"))
    before = snapshot(admin.engine)
    for data in ({"ids": ["abc"]}, {"ids": [str(2**63)]}, {"ids": [str(n) for n in range(1, 502)]}, {}):
        response = admin.client.post("/admin/outboxes/webhooks/reset-selected", data={"csrf_token": token, **data})
        assert response.status_code == 422
    response = admin.client.post("/admin/outboxes/webhooks/bulk-reset", data={"csrf_token": token, "error_contains": "a\x00b"})
    assert response.status_code == 422
    assert snapshot(admin.engine) == before


def test_audit_and_schedules_pages_render(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    audit = admin.client.get("/admin/audit")
    assert audit.status_code == 200 and f"<td class=\"small\">{row_id}</td>" in audit.text
    schedules = admin.client.get("/admin/schedules")  # the kit's internal jobs are listed with the schedules
    assert schedules.status_code == 200 and 'data-internal-job="outboxkit.drain.webhooks"' in schedules.text
    assert "every minute (UTC)" in schedules.text
