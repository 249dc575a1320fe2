"""Replay: delivered rows sent again by filter or time range, in batches, audited, never a held row, bad input refused."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from exampleapp.models import WebhookOutbox
from sqlalchemy import text

from outboxkit.errors import MigrationRequired
from outboxkit.operations.service import OperationsService
from outboxkit.storage.notify import channel_for
from outboxkit.storage.row_filter import RowFilter
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    listening,
    notified,
    row_of,
    snapshot,
)

REPLAY = "/admin/api/outboxes/webhooks/replay"
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def delivered(admin, receiver, count: int, **columns) -> list[int]:
    """``count`` webhook rows delivered to ``receiver`` by a real drain (so each has its attempt recorded)."""
    ids = add_webhooks(
        admin.engine, count, status="pending", attempts=0, error=None, status_code=None,
        target_url=receiver.url + "/hook", **columns,
    )
    admin.kit.drain_once("webhooks")
    assert {row_of(admin.engine, row_id)["status"] for row_id in ids} == {"done"}
    return ids


def attempts_of(engine, row_id: int) -> list[tuple[int, str, int | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT attempt, outcome, status_code FROM outboxkit_attempts WHERE row_id = :id ORDER BY id"), {"id": row_id}
        )
        return [tuple(row) for row in rows]


def set_delivered_at(engine, row_id: int, moment: datetime) -> None:
    with engine.begin() as connection:
        connection.execute(text("UPDATE webhook_outbox SET delivered_at = :at WHERE id = :id"), {"at": moment, "id": row_id})


def test_a_dry_run_counts_and_samples_the_delivered_rows_and_changes_nothing(admin):
    done = add_webhooks(admin.engine, 3, status="done", error=None, status_code=200, event="refund.created")
    add_webhooks(admin.engine, 2, status="done", error=None, status_code=200, event="grant.created")
    add_webhooks(admin.engine, 2, status="stuck", event="refund.created")
    before = snapshot(admin.engine)

    outcome = admin.client.post(REPLAY, json={"payload_column": "event", "payload_contains": "refund"}).json()

    assert outcome["dry_run"] is True  # the default
    assert (outcome["matched"], outcome["matched_at_least"], outcome["replayed"]) == (3, False, 0)
    assert outcome["sample_ids"] == sorted(done, reverse=True)
    assert outcome["audit_ids"] == [] and outcome["replay_id"] is None
    assert snapshot(admin.engine) == before


def test_a_replay_in_small_batches_sends_every_row_again_with_its_key_and_records_the_attempt(
    admin, admin_database_url, receiver
):
    ids = delivered(admin, receiver, 5)
    first_keys = Counter(request.key for request in receiver.requests)
    assert len(first_keys) == 5

    with listening(admin_database_url, WebhookOutbox) as listener:
        outcome = admin.client.post(REPLAY, json={"dry_run": False, "batch_size": 2}).json()
        assert set(notified(listener)) == {channel_for(WebhookOutbox)}  # each batch woke the drains

    assert (outcome["matched"], outcome["replayed"], outcome["batches"], outcome["batch_size"]) == (5, 5, 3, 2)
    for row_id in ids:
        row = row_of(admin.engine, row_id)
        assert (row["status"], row["attempts"], row["next_attempt_at"]) == ("pending", 0, admin.clock.now())
        assert row["delivered_at"] is None and row["claim_token"] is None and row["claimed_until"] is None

    admin.kit.drain_once("webhooks")

    assert {row_of(admin.engine, row_id)["status"] for row_id in ids} == {"done"}
    assert Counter(request.key for request in receiver.requests) == Counter({key: 2 for key in first_keys})
    for row_id in ids:  # the first delivery, the replay's marker, and the replay's delivery, numbered on
        assert attempts_of(admin.engine, row_id) == [(1, "done", 200), (1, "reset", None), (2, "done", 200)]


def test_each_batch_is_audited_with_its_rows_and_the_replay_it_belongs_to(admin):
    ids = add_webhooks(admin.engine, 5, status="done", error=None, status_code=200)

    outcome = admin.client.post(REPLAY, json={"dry_run": False, "batch_size": 2, "attempts_min": 1}).json()

    entries = audit_entries(admin.engine)
    assert [entry["id"] for entry in entries] == outcome["audit_ids"]
    assert [entry["action"] for entry in entries] == ["replay"] * 3
    assert [entry["row_ids"] for entry in entries] == [ids[0:2], ids[2:4], ids[4:5]]
    assert [entry["row_count"] for entry in entries] == [2, 2, 1]
    assert {entry["actor"] for entry in entries} == {"admin"}
    assert {entry["filter"]["replay"] for entry in entries} == {outcome["replay_id"]}
    assert [entry["filter"]["batch"] for entry in entries] == [1, 2, 3]
    assert {entry["filter"]["attempts_min"] for entry in entries} == {1}
    listed = admin.client.get("/admin/api/audit").json()["entries"]
    assert [entry["action"] for entry in listed] == ["replay"] * 3


def test_only_delivered_rows_are_replayed_never_a_held_pending_or_stuck_row(admin):
    now = admin.clock.now()
    (held,) = add_webhooks(admin.engine, 1, status="pending", claimed_until=now + timedelta(seconds=60), error=None)
    (waiting,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=now + timedelta(hours=1))
    (stuck,) = add_webhooks(admin.engine, 1, status="stuck")
    (done,) = add_webhooks(admin.engine, 1, status="done", error=None, status_code=200)
    untouched = {row_id: row_of(admin.engine, row_id) for row_id in (held, waiting, stuck)}

    outcome = admin.client.post(REPLAY, json={"dry_run": False}).json()

    assert (outcome["matched"], outcome["replayed"]) == (1, 1)
    assert row_of(admin.engine, done)["status"] == "pending"
    assert {row_id: row_of(admin.engine, row_id) for row_id in untouched} == untouched
    assert audit_entries(admin.engine)[0]["row_ids"] == [done]


def test_a_row_delivered_again_while_the_replay_runs_is_not_replayed_twice(admin, receiver):
    ids = delivered(admin, receiver, 6)
    drained_between_batches = []

    def drain_between_batches(replayed: int, batches: int) -> None:
        # The drain sends each batch at once, so those rows are `done` (and match) again before the next batch.
        drained_between_batches.append(admin.kit.drain_once("webhooks").delivered)

    outcome = OperationsService(admin.kit).replays.replay(
        "webhooks", RowFilter(), actor="test", dry_run=False, batch_size=2, progress=drain_between_batches
    )

    assert outcome.replayed == 6 and drained_between_batches == [2, 2, 2]
    assert Counter(Counter(request.key for request in receiver.requests).values()) == Counter({2: 6})
    assert {row_of(admin.engine, row_id)["status"] for row_id in ids} == {"done"}


def test_a_time_range_on_delivered_at_picks_the_rows_to_replay(admin):
    early, inside, late = add_webhooks(admin.engine, 3, status="done", error=None, status_code=200)
    start = datetime(2030, 1, 1, 10, 0, tzinfo=timezone.utc)
    set_delivered_at(admin.engine, early, start - timedelta(seconds=1))
    set_delivered_at(admin.engine, inside, start)
    set_delivered_at(admin.engine, late, start + timedelta(hours=1))

    body = {"delivered_after": "2030-01-01T10:00:00", "delivered_before": "2030-01-01T11:00:00+00:00", "dry_run": False}
    outcome = admin.client.post(REPLAY, json=body).json()

    assert (outcome["matched"], outcome["replayed"]) == (1, 1)
    assert [row_of(admin.engine, row_id)["status"] for row_id in (early, inside, late)] == ["done", "pending", "done"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/admin/api/outboxes/nope/replay", {"dry_run": False}, 404),
        (REPLAY, {"dry_run": False, "payload_column": "secret", "payload_contains": "x"}, 422),
        (REPLAY, {"dry_run": False, "batch_size": 0}, 422),
        (REPLAY, {"dry_run": False, "batch_size": 10_001}, 422),
        (REPLAY, {"dry_run": False, "batch_size": 10**12}, 422),
        (REPLAY, {"dry_run": False, "batch_size": "5"}, 422),
        (REPLAY, {"dry_run": False, "batch_size": True}, 422),
        (REPLAY, {"dry_run": "no"}, 422),
        (REPLAY, {"dry_run": 0}, 422),
        (REPLAY, {"dry_run": False, "delivered_after": 0.5}, 422),
        (REPLAY, {"dry_run": False, "delivered_after": "yesterday"}, 422),
        (REPLAY, {"dry_run": False, "status_code": "200"}, 422),
        (REPLAY, {"dry_run": False, "error_contains": "a\x00b"}, 422),
        (REPLAY, {"dry_run": False, "ids": [1]}, 422),
    ],
)
def test_bad_input_is_refused_with_a_clear_4xx_and_changes_nothing(admin, path, body, status):
    add_webhooks(admin.engine, 3, status="done", error=None, status_code=200)
    before = snapshot(admin.engine)

    response = admin.client.post(path, json=body)

    assert response.status_code == status, response.text
    assert response.json()["detail"]
    assert snapshot(admin.engine) == before


def test_the_replay_page_shows_the_dry_run_count_and_replays_on_confirmation(admin):
    matching = add_webhooks(admin.engine, 3, status="done", error=None, status_code=200, event="refund.created")
    other = add_webhooks(admin.engine, 2, status="done", error=None, status_code=200, event="grant.created")
    before = snapshot(admin.engine)
    done_tab = admin.client.get("/admin/outboxes/webhooks", params={"status": "done"})
    assert "Replay matching" in done_tab.text

    query = {"payload_column": "event", "payload_contains": "refund"}
    confirm = admin.client.get("/admin/outboxes/webhooks/replay", params=query)
    assert confirm.status_code == 200
    assert re.search(r"<strong>3</strong> delivered row\(s\) match now", confirm.text)
    assert snapshot(admin.engine) == before

    refused = admin.client.post("/admin/outboxes/webhooks/replay", data={**query, "csrf_token": "forged"})
    assert refused.status_code == 403 and snapshot(admin.engine) == before
    absurd = admin.client.post(
        "/admin/outboxes/webhooks/replay", data={**query, "csrf_token": _token(confirm), "batch_size": "0"}
    )
    assert absurd.status_code == 422 and snapshot(admin.engine) == before

    response = admin.client.post(
        "/admin/outboxes/webhooks/replay", data={**query, "csrf_token": _token(confirm), "batch_size": "2"}
    )
    assert response.status_code == 303
    assert [row_of(admin.engine, row_id)["status"] for row_id in matching] == ["pending"] * 3
    assert [row_of(admin.engine, row_id)["status"] for row_id in other] == ["done"] * 2
    assert "Replayed 3 delivered row(s)" in admin.client.get(response.headers["location"]).text
    assert [entry["row_count"] for entry in audit_entries(admin.engine)] == [2, 1]


def test_the_replay_page_refuses_a_bad_filter_or_unknown_outbox_with_an_error_page(admin):
    assert admin.client.get("/admin/outboxes/nope/replay").status_code == 404
    bad = admin.client.get("/admin/outboxes/webhooks/replay", params={"delivered_after": "soon"})
    assert bad.status_code == 422 and "delivered after" in bad.text


def _token(page) -> str:
    match = TOKEN.search(page.text)
    assert match, "the page has no CSRF field"
    return match.group(1)


def test_the_rows_listing_filters_on_delivery_time_too(admin):
    early, late = add_webhooks(admin.engine, 2, status="done", error=None, status_code=200)
    set_delivered_at(admin.engine, early, datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc))
    set_delivered_at(admin.engine, late, datetime(2030, 1, 1, 11, 0, tzinfo=timezone.utc))
    query = {"status": "done", "delivered_after": "2030-01-01T10:00:00"}

    listed = admin.client.get("/admin/api/outboxes/webhooks/rows", params=query).json()
    page = admin.client.get("/admin/outboxes/webhooks", params=query).text

    assert [row["id"] for row in listed["rows"]] == [late]
    assert listed["filter"]["delivered_after"] == "2030-01-01T10:00:00Z"
    assert f'/admin/outboxes/webhooks/rows/{late}"' in page and f'/admin/outboxes/webhooks/rows/{early}"' not in page
    assert 'name="delivered_after" value="2030-01-01T10:00:00"' in page


def test_without_migration_outboxkit_0004_a_replay_says_which_migration_to_run_and_changes_nothing(admin):
    add_webhooks(admin.engine, 2, status="done", error=None, status_code=200)
    old_check = "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now')"
    new_check = "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now', 'replay')"
    constraint = "ck_outboxkit_reset_audit_action"

    def set_check(check: str) -> None:
        with admin.engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE outboxkit_reset_audit DROP CONSTRAINT {constraint}"))
            connection.execute(text(f"ALTER TABLE outboxkit_reset_audit ADD CONSTRAINT {constraint} CHECK ({check})"))

    set_check(old_check)
    try:
        before = snapshot(admin.engine)
        with pytest.raises(MigrationRequired, match="outboxkit_0004"):
            OperationsService(admin.kit).replays.replay("webhooks", RowFilter(), actor="test", dry_run=False)
        answer = admin.client.post("/admin/api/outboxes/webhooks/replay", json={"dry_run": False})
        assert answer.status_code == 503 and "outboxkit_0004" in answer.text  # a clear refusal, not a 500
        assert snapshot(admin.engine) == before
    finally:
        set_check(new_check)
