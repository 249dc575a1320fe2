"""Operator work is bounded: counts stop at a cap and say so; a filter reset runs in short batches and reports them."""

from __future__ import annotations

import itertools
import re
import threading
from datetime import timedelta

import psycopg
import pytest

from outboxkit.admin import CSRF_COOKIE
from outboxkit.admin.flash import Flash
from outboxkit.operations import bulk_reset, controls
from outboxkit.operations.bulk_reset import BulkReset
from outboxkit.storage.row_filter import RowFilter
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    cookie_named,
    row_of,
    snapshot,
)
from tests.support.database import libpq_url

MATCHING = "/admin/api/outboxes/webhooks/reset-matching"


def statuses(engine, ids: list[int]) -> set[str]:
    return {row_of(engine, row_id)["status"] for row_id in ids}


# -- capped counts -------------------------------------------------------------------


def test_the_bulk_reset_count_stops_at_its_cap_and_says_so_in_the_api_and_the_page(admin, monkeypatch):
    monkeypatch.setattr(bulk_reset, "MATCH_COUNT_CAP", 5)
    add_webhooks(admin.engine, 7, status="stuck", error="HTTP 400: bad amount")
    preview = admin.client.post(MATCHING, json={"error_contains": "bad amount"}).json()
    assert (preview["matched"], preview["matched_at_least"], preview["changed"]) == (5, True, 0)
    page = admin.client.get("/admin/outboxes/webhooks/bulk-reset", params={"error_contains": "bad amount"})
    assert re.search(r"<strong>5\+</strong> stuck row\(s\) match now", page.text)
    assert "counted up to 5, so at least that many" in page.text
    assert "Reset 5+ row(s)" in page.text

    add_webhooks(admin.engine, 1, status="stuck", error="HTTP 404")
    below = admin.client.post(MATCHING, json={"error_contains": "HTTP 404"}).json()
    assert (below["matched"], below["matched_at_least"]) == (1, False)


def test_drain_now_counts_due_rows_up_to_its_cap_and_says_so(admin, monkeypatch):
    monkeypatch.setattr(controls, "DUE_COUNT_CAP", 5)
    add_webhooks(admin.engine, 7, status="pending", error=None, status_code=None, next_attempt_at=START - timedelta(minutes=1))
    response = admin.client.post("/admin/api/outboxes/webhooks/drain-now", json={})
    assert response.status_code == 200, response.text
    assert (response.json()["due_rows"], response.json()["due_rows_at_least"]) == (5, True)
    for thread in threading.enumerate():  # the drain it started here must not claim the next test's rows
        if thread.name == "outboxkit-drain-now-webhooks":
            thread.join(timeout=60)


def test_the_drain_now_notice_says_at_least_when_the_count_reached_its_cap(admin):
    add_webhooks(admin.engine, 1, status="pending", error=None, status_code=None, next_attempt_at=START - timedelta(minutes=1))
    page = admin.client.get("/admin/outboxes/webhooks")
    token = cookie_named(admin.client, CSRF_COOKIE).value
    assert page.status_code == 200
    response = admin.client.post("/admin/outboxes/webhooks/drain-now", data={"csrf_token": token})
    notice = admin.client.get(response.headers["location"]).text
    assert "1 row(s) were due" in notice, re.findall(r"alert[^>]*>[^<]*", notice)
    assert "at least 10,000 rows were due" in Flash(kind="drain_now", count=controls.DUE_COUNT_CAP).message


# -- batches -------------------------------------------------------------------------


def test_a_filter_reset_runs_in_batches_each_audited_and_a_rerun_changes_nothing(admin):
    matching = add_webhooks(admin.engine, 2_500, status="stuck", error="timeout after 10s", status_code=None)
    other = add_webhooks(admin.engine, 3, status="stuck", error="HTTP 404", status_code=404)
    held = add_webhooks(
        admin.engine, 1, status="pending", error="timeout after 10s", claimed_until=START + timedelta(minutes=5)
    )
    before_held = row_of(admin.engine, held[0])

    outcome = admin.client.post(MATCHING, json={"error_contains": "timeout", "dry_run": False}).json()
    assert (outcome["changed"], outcome["batches"], outcome["complete"]) == (2_500, 3, True)
    assert statuses(admin.engine, matching) == {"pending"} and statuses(admin.engine, other) == {"stuck"}
    assert row_of(admin.engine, held[0]) == before_held  # the row a drain holds is not touched
    entries = audit_entries(admin.engine)
    assert [entry["id"] for entry in entries] == outcome["audit_ids"] and outcome["audit_id"] == entries[0]["id"]
    assert [entry["row_count"] for entry in entries] == [1_000, 1_000, 500]
    assert sorted(itertools.chain.from_iterable(entry["row_ids"] for entry in entries)) == matching
    assert {str(entry["filter"]["error_contains"]) for entry in entries} == {"timeout"}

    before = snapshot(admin.engine)
    again = admin.client.post(MATCHING, json={"error_contains": "timeout", "dry_run": False}).json()
    assert (again["changed"], again["batches"], again["complete"], again["audit_ids"]) == (0, 1, True, [])
    assert snapshot(admin.engine) == before


def test_a_filter_reset_skips_a_row_another_transaction_holds_instead_of_waiting(admin, admin_database_url):
    ids = add_webhooks(admin.engine, 3, status="stuck")
    with psycopg.connect(libpq_url(admin_database_url)) as locker:
        locker.execute("SET idle_in_transaction_session_timeout = '20s'")
        locker.execute("SELECT id FROM webhook_outbox WHERE id = %s FOR UPDATE", [ids[1]])
        outcome = admin.client.post(MATCHING, json={"dry_run": False}).json()
        locker.rollback()
    assert (outcome["changed"], outcome["complete"]) == (2, True)
    assert [row_of(admin.engine, row_id)["status"] for row_id in ids] == ["pending", "stuck", "pending"]
    rerun = admin.client.post(MATCHING, json={"dry_run": False}).json()  # safe to repeat: it takes the rest
    assert rerun["changed"] == 1 and statuses(admin.engine, ids) == {"pending"}


def test_a_run_that_stops_at_its_time_share_says_so_and_a_rerun_finishes_without_touching_a_row_twice(admin):
    ids = add_webhooks(admin.engine, 5, status="stuck")
    ticks = iter([0.0, 0.0, 100.0])  # started, before batch 1, before batch 2: the share is spent
    partial = BulkReset(admin.kit, batch_size=2, timer=lambda: next(ticks)).run(
        "webhooks", RowFilter(), dry_run=False, actor="tester", max_seconds=20.0
    )
    assert (partial.changed, partial.batches, partial.complete) == (2, 1, False)
    assert [row_of(admin.engine, row_id)["status"] for row_id in ids] == ["pending"] * 2 + ["stuck"] * 3

    rest = BulkReset(admin.kit, batch_size=2).run("webhooks", RowFilter(), dry_run=False, actor="tester", max_seconds=None)
    assert (rest.changed, rest.batches, rest.complete) == (3, 2, True)
    reset_ids = [row_id for entry in audit_entries(admin.engine) for row_id in entry["row_ids"]]
    assert sorted(reset_ids) == ids  # every row once


def test_the_notice_of_a_partial_run_says_how_many_were_reset_and_to_go_on():
    message = Flash(kind="reset_partial", count=3_000).message
    assert "Reset 3,000 row(s), in batches; more rows may match" in message and "again to go on" in message


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_api_reports_batches_and_completeness(admin, dry_run):
    add_webhooks(admin.engine, 2, status="stuck")
    outcome = admin.client.post(MATCHING, json={"dry_run": dry_run}).json()
    assert outcome["complete"] is True and outcome["batches"] == (0 if dry_run else 1)
    assert outcome["changed"] == (0 if dry_run else 2)
