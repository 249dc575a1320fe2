"""The admin's JSON API against a real database: reads, actions, the audit, jobs and the leader."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import psycopg
import pytest
from exampleapp.models import WebhookOutbox
from sqlalchemy import text

from outboxkit.admin import JobInfo
from outboxkit.storage.notify import channel_for
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    audit_entries,
    empty_tables,
    listening,
    notified,
    record_run,
    row_of,
    snapshot,
)
from tests.support.database import server_url
from tests.support.receiver import Reply


def test_overview_counts_statuses_in_flight_oldest_due_and_last_drain(admin):
    now = admin.clock.now()
    add_webhooks(admin.engine, 3, status="stuck")
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=now - timedelta(minutes=10))
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=now + timedelta(hours=1))
    lease = now + timedelta(minutes=2)
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=lease, claimed_until=lease)
    add_webhooks(admin.engine, 4, status="done", error=None, status_code=200)
    record_run(admin.engine, "outboxkit.drain.webhooks", "drain webhooks", now - timedelta(seconds=30), counts={"delivered": 3})

    response = admin.client.get("/admin/api/outboxes")

    assert response.status_code == 200
    boxes = {box["name"]: box for box in response.json()["outboxes"]}
    webhooks = boxes["webhooks"]
    assert webhooks["counts"] == {
        "pending": 4,
        "pending_estimated": False,
        "in_flight": 2,
        "stuck": 3,
        "stuck_estimated": False,
        "done": 4,
        "done_estimated": False,
        "discarded": 0,
        "discarded_estimated": False,
        "held_by_order": None,  # no ordering key
        "held_by_order_estimated": False,
    }
    assert webhooks["oldest_due_age_seconds"] == pytest.approx(600)
    assert webhooks["last_drain"]["outcome"] == "ok"
    assert webhooks["last_drain"]["counts"] == {"delivered": 3}
    assert boxes["credit-grants"]["counts"]["stuck"] == 0
    assert boxes["credit-grants"]["last_drain"] is None


def test_overview_labels_done_as_an_estimate_on_a_big_table(admin):
    add_webhooks(admin.engine, 12_000, status="done", error=None, status_code=200)
    add_webhooks(admin.engine, 5, status="stuck")
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("ANALYZE webhook_outbox"))

    counts = next(box for box in admin.client.get("/admin/api/outboxes").json()["outboxes"] if box["name"] == "webhooks")[
        "counts"
    ]

    assert counts["done_estimated"] is True
    assert counts["stuck"] == 5
    assert abs(counts["done"] - 12_000) < 1_200


def test_rows_are_keyset_paginated_newest_first_without_gaps(admin):
    ids = add_webhooks(admin.engine, 7, status="stuck")
    add_webhooks(admin.engine, 2, status="done", error=None)
    seen, cursor = [], None
    for _ in range(5):
        params = {"status": "stuck", "limit": 3} | ({"cursor": cursor} if cursor else {})
        page = admin.client.get("/admin/api/outboxes/webhooks/rows", params=params).json()
        seen += [row["id"] for row in page["rows"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids, reverse=True)


def test_pending_rows_come_in_due_order_across_pages(admin):
    now = admin.clock.now()
    later = add_webhooks(admin.engine, 2, status="pending", next_attempt_at=now + timedelta(hours=2))
    sooner = add_webhooks(admin.engine, 2, status="pending", next_attempt_at=now + timedelta(hours=1))
    first = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"status": "pending", "limit": 3}).json()
    second = admin.client.get(
        "/admin/api/outboxes/webhooks/rows", params={"status": "pending", "limit": 3, "cursor": first["next_cursor"]}
    ).json()
    assert [row["id"] for row in first["rows"] + second["rows"]] == sooner + later
    assert all(row["in_backoff"] for row in first["rows"])


@pytest.mark.parametrize(
    ("needle", "expected"),
    [("50%", ["at 50% load"]), ("a_b", ["a_b"]), ("back\\slash", ["back\\slash"]), ("' OR 1=1--", ["' OR 1=1-- literally"])],
)
def test_error_filter_treats_wildcards_and_quotes_as_text(admin, needle, expected):
    for error in ["at 50% load", "at 50 load", "a_b", "axb", "back\\slash", "backslash", "' OR 1=1-- literally", "plain"]:
        add_webhooks(admin.engine, 1, status="stuck", error=error)
    page = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"error_contains": needle}).json()
    assert [row["last_error"] for row in page["rows"]] == expected


def test_status_code_filter_and_list_error_truncation(admin):
    add_webhooks(admin.engine, 2, status="stuck", status_code=400, error="x" * 1500)
    add_webhooks(admin.engine, 1, status="stuck", status_code=422)
    page = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"status_code": 400}).json()
    assert len(page["rows"]) == 2
    assert all(len(row["last_error"]) == 200 and row["last_error_truncated"] for row in page["rows"])


def test_row_detail_shows_payload_columns_and_kit_fields(admin):
    (row_id,) = add_webhooks(admin.engine, 1, payload={"workspace": "w1", "amount": 5}, error="HTTP 400: bad amount")
    detail = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()
    payload = {field["name"]: field for field in detail["payload"]}
    assert set(payload) == {"event", "target_url", "payload"}
    assert payload["payload"]["text"] == '{"amount": 5, "workspace": "w1"}'
    assert payload["payload"]["truncated"] is False
    assert detail["last_error"] == "HTTP 400: bad amount"
    assert detail["attempts"] == 1 and detail["status"] == "stuck"


def test_row_detail_cuts_a_huge_value_in_sql(admin):
    (row_id,) = add_webhooks(admin.engine, 1, payload={"blob": "y" * 1_000_000})
    detail = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()
    field = next(field for field in detail["payload"] if field["name"] == "payload")
    assert len(field["text"]) == 10_000 and field["length"] > 1_000_000 and field["truncated"]


def test_reset_moves_a_stuck_row_to_pending_due_now_and_is_audited(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck", attempts=5)

    response = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})

    assert response.status_code == 200
    assert response.json()["changed_ids"] == [row_id]
    row = row_of(admin.engine, row_id)
    assert (row["status"], row["attempts"], row["next_attempt_at"]) == ("pending", 0, admin.clock.now())
    assert row["claimed_until"] is None and row["claim_token"] is None
    (entry,) = audit_entries(admin.engine)
    assert (entry["actor"], entry["outbox"], entry["action"], entry["row_count"], entry["row_ids"]) == (
        "admin",
        "webhooks",
        "reset",
        1,
        [row_id],
    )
    assert entry["id"] == response.json()["audit_id"]


def test_reset_is_idempotent(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    before = snapshot(admin.engine)

    again = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]}).json()

    assert again["changed"] == 0 and again["skipped"] == [{"id": row_id, "reason": "already pending"}]
    assert again["audit_id"] is None
    assert snapshot(admin.engine) == before


def test_reset_of_a_list_skips_done_rows_and_refuses_unknown_ids_whole(admin):
    stuck = add_webhooks(admin.engine, 2, status="stuck")
    (done,) = add_webhooks(admin.engine, 1, status="done", error=None)
    before = snapshot(admin.engine)
    missing = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [*stuck, 999_999]})
    assert missing.status_code == 404 and "999999" in missing.json()["detail"]
    assert snapshot(admin.engine) == before

    result = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [*stuck, done]}).json()
    assert result["changed_ids"] == stuck
    assert [skip["id"] for skip in result["skipped"]] == [done]
    assert row_of(admin.engine, done)["status"] == "done"


def test_retry_now_makes_a_pending_row_in_backoff_due_and_keeps_attempts(admin):
    (backoff,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=3, next_attempt_at=admin.clock.now() + timedelta(hours=1)
    )
    (stuck,) = add_webhooks(admin.engine, 1, status="stuck")

    result = admin.client.post("/admin/api/outboxes/webhooks/retry-now", json={"ids": [backoff, stuck]}).json()

    assert result["changed_ids"] == [backoff]
    assert result["skipped"] == [{"id": stuck, "reason": "stuck; reset it instead"}]
    row = row_of(admin.engine, backoff)
    assert (row["status"], row["attempts"], row["next_attempt_at"]) == ("pending", 3, admin.clock.now())
    assert audit_entries(admin.engine)[-1]["action"] == "retry_now"


def test_a_row_a_drain_holds_is_refused_with_409_and_left_alone(admin, receiver):
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", target_url=receiver.url + "/hook", attempts=0)
    receiver.respond = lambda request: Reply(hang=True)
    drain = threading.Thread(target=admin.kit.drain_once, args=("webhooks",))
    drain.start()
    try:
        receiver.wait_for(lambda r: r.in_flight == 1)
        before = snapshot(admin.engine)
        held = row_of(admin.engine, row_id)
        assert held["claimed_until"] > admin.clock.now()

        for action in ("reset", "retry-now"):
            response = admin.client.post(f"/admin/api/outboxes/webhooks/{action}", json={"ids": [row_id]})
            assert response.status_code == 409, response.text
            assert "holds" in response.json()["detail"]
        detail = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()
        assert detail["held"] is True
        assert snapshot(admin.engine) == before
    finally:
        receiver.release()
        drain.join(timeout=30)
    assert row_of(admin.engine, row_id)["status"] == "done"


def test_reset_matching_dry_run_counts_then_resets_and_audits_the_filter(admin):
    timeouts = add_webhooks(admin.engine, 3, status="stuck", error="timeout after 10s", status_code=None)
    add_webhooks(admin.engine, 2, status="stuck", error="HTTP 400 bad request", status_code=400)
    before = snapshot(admin.engine)
    url = "/admin/api/outboxes/webhooks/reset-matching"

    preview = admin.client.post(url, json={"error_contains": "TIMEOUT"}).json()
    assert (preview["dry_run"], preview["matched"], preview["changed"]) == (True, 3, 0)
    assert preview["sample_ids"] == sorted(timeouts, reverse=True)
    assert snapshot(admin.engine) == before

    applied = admin.client.post(url, json={"error_contains": "TIMEOUT", "dry_run": False}).json()
    assert applied["changed"] == 3
    assert {row_of(admin.engine, row_id)["status"] for row_id in timeouts} == {"pending"}
    entry = audit_entries(admin.engine)[-1]
    assert entry["filter"] == {"error_contains": "TIMEOUT", "status_code": None}
    assert sorted(entry["row_ids"]) == timeouts and entry["row_count"] == 3


def test_audit_lists_newest_first_with_outbox_filter_and_cursor(admin):
    ids = add_webhooks(admin.engine, 3, status="stuck")
    for row_id in ids:
        admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    first = admin.client.get("/admin/api/audit", params={"limit": 2, "outbox": "webhooks"}).json()
    second = admin.client.get("/admin/api/audit", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [entry["row_ids"] for entry in first["entries"] + second["entries"]] == [[row_id] for row_id in reversed(ids)]
    assert second["next_cursor"] is None
    assert admin.client.get("/admin/api/audit", params={"outbox": "credit-grants"}).json()["entries"] == []
    assert admin.client.get("/admin/api/audit", params={"outbox": "nope"}).status_code == 404


def test_jobs_from_run_history_show_each_jobs_last_run_failures_and_every_drain(admin):
    now = admin.clock.now()
    record_run(admin.engine, "outboxkit.drain.webhooks", "drain webhooks", now - timedelta(minutes=2), "error")
    record_run(admin.engine, "outboxkit.drain.webhooks", "drain webhooks", now - timedelta(minutes=1))
    record_run(admin.engine, "app.report", "nightly report", now - timedelta(hours=5))
    view = admin.client.get("/admin/api/jobs").json()
    assert view["source"] == "run_history"
    jobs = {job["id"]: job for job in view["jobs"]}
    assert set(jobs) == {"outboxkit.drain.webhooks", "outboxkit.drain.credit-grants", "app.report"}
    webhooks = jobs["outboxkit.drain.webhooks"]
    assert webhooks["last_run"]["outcome"] == "ok"
    assert (webhooks["failures"], webhooks["runs_kept"]) == (1, 2)
    assert webhooks["outbox"] == "webhooks" and webhooks["paused"] is False
    assert webhooks["schedule"] == "every minute (UTC)"  # the kit's own safety-net interval, without a job source
    assert jobs["outboxkit.drain.credit-grants"]["last_run"] is None
    assert jobs["app.report"]["schedule"] is None and jobs["app.report"]["outbox"] is None


def test_jobs_from_a_job_source_and_a_failing_one(admin_database_url, clock):
    database_url = admin_database_url
    empty_tables(database_url)
    next_run = clock.now() + timedelta(seconds=40)

    class Jobs:
        def jobs(self):
            return [
                JobInfo(id="outboxkit.drain.webhooks", name="drain webhooks", trigger="interval[0:01:00]", next_run_at=next_run)
            ]

    class Broken:
        def jobs(self):
            raise RuntimeError("scheduler is not started")

    with admin_harness(database_url, clock=clock, job_source=Jobs()) as harness:
        view = harness.client.get("/admin/api/jobs").json()
        assert view["source"] == "job_source"
        assert view["jobs"] == [
            {
                "id": "outboxkit.drain.webhooks",
                "name": "drain webhooks",
                "trigger": "interval[0:01:00]",
                "schedule": "every minute (timezone not given by the job source)",
                "next_run_at": next_run.isoformat().replace("+00:00", "Z"),
                "last_run": None,
                "failures": 0,
                "runs_kept": 0,
                "outbox": "webhooks",
                "paused": False,
                "paused_by": None,
                "paused_at": None,
            }
        ]
    with admin_harness(database_url, clock=clock, job_source=Broken()) as harness:
        view = harness.client.get("/admin/api/jobs").json()
        assert view["source"] == "run_history" and "scheduler is not started" in view["source_error"]


def test_leader_is_the_lock_holder_in_this_database_only(admin, admin_database_url):
    database_url = admin_database_url
    other_database = server_url()
    with (
        psycopg.connect(database_url, autocommit=True, application_name="outboxkit-leader:host-a.example:4242") as here,
        psycopg.connect(other_database, autocommit=True, application_name="outboxkit-leader:elsewhere:1") as there,
    ):
        key = admin.kit.settings.advisory_lock_key
        assert here.execute("SELECT pg_try_advisory_lock(%s::bigint)", (key,)).fetchone()[0]
        there.execute("SELECT pg_try_advisory_lock(%s::bigint)", (key,))  # the same key in another database
        backend_pid = here.info.backend_pid

        for path in ("/admin/api/jobs", "/admin/api/outboxes"):
            view = admin.client.get(path).json()
            assert [(leader["host"], leader["pid"], leader["backend_pid"]) for leader in view["leaders"]] == [
                ("host-a.example", 4242, backend_pid)
            ]
            assert view["leader"]["host"] == "host-a.example"
        # Unlock explicitly: a closed connection's backend may linger for a moment.
        here.execute("SELECT pg_advisory_unlock(%s::bigint)", (key,))
        assert admin.client.get("/admin/api/jobs").json()["leader"] is None


def test_concurrent_bulk_and_list_resets_queue_instead_of_failing(admin):
    ids = add_webhooks(admin.engine, 300, status="stuck", error="timeout")
    barrier = threading.Barrier(3)
    answers = []

    def bulk():
        barrier.wait()
        answers.append(
            admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"error_contains": "timeout", "dry_run": False})
        )

    def listed():
        barrier.wait()
        answers.append(admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": list(reversed(ids))}))

    threads = [threading.Thread(target=target) for target in (bulk, bulk, listed)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(answer.status_code for answer in answers) == [200, 200, 200]
    assert sum(answer.json()["changed"] for answer in answers) == 300
    assert sum(entry["row_count"] for entry in audit_entries(admin.engine)) == 300


# -- actions wake the drain (NOTIFY in the action's transaction) ---------------------


@pytest.mark.parametrize(
    ("action", "body"),
    [("reset", None), ("retry-now", None), ("reset-matching", {"dry_run": False, "status_code": 400})],
)
def test_an_api_action_wakes_a_listening_drainer_when_it_commits(admin, admin_database_url, action, body):
    status = "pending" if action == "retry-now" else "stuck"
    (row_id,) = add_webhooks(admin.engine, 1, status=status, next_attempt_at=admin.clock.now() + timedelta(hours=1))
    with listening(admin_database_url, WebhookOutbox) as listener:
        response = admin.client.post(f"/admin/api/outboxes/webhooks/{action}", json=body or {"ids": [row_id]})
        assert response.status_code == 200 and response.json()["changed"] == 1, response.text
        assert notified(listener) == [channel_for(WebhookOutbox)]


def test_a_page_reset_wakes_a_listening_drainer(admin, admin_database_url):
    ids = add_webhooks(admin.engine, 2, status="stuck")
    page = admin.client.get("/admin/outboxes/webhooks")
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    with listening(admin_database_url, WebhookOutbox) as listener:
        response = admin.client.post(
            "/admin/outboxes/webhooks/reset-selected", data={"csrf_token": token, "ids": [str(i) for i in ids]}
        )
        assert response.status_code == 303
        assert notified(listener) == [channel_for(WebhookOutbox)]


def test_an_action_that_changes_nothing_sends_no_wake_up(admin, admin_database_url):
    (row_id,) = add_webhooks(admin.engine, 1, status="done", error=None, status_code=200)
    add_webhooks(admin.engine, 1, status="stuck")
    with listening(admin_database_url, WebhookOutbox) as listener:
        assert admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]}).json()["changed"] == 0
        dry = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"dry_run": True})
        assert dry.json()["matched"] == 1
        # Absence can only be shown by waiting; a short wait suffices (a NOTIFY arrives on commit).
        assert notified(listener, timeout=0.5) == []
