"""Attempt history: the drain records every attempt; the row page and API show it; a reset keeps it; retention trims it."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from sqlalchemy import text

from outboxkit.storage.attempts import AttemptLog, AttemptRecord
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
)
from tests.support.receiver import Reply


def attempts_of(engine, row_id: int) -> list[dict]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM outboxkit_attempts WHERE row_id = :id ORDER BY id"), {"id": row_id})
        return [dict(row._mapping) for row in rows]


def test_every_attempt_is_recorded_with_outcome_code_error_timing_and_sender(admin, receiver):
    (row_id,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook"
    )
    receiver.respond = lambda request: Reply(status=503)
    admin.kit.drain_once("webhooks")
    admin.clock.advance(timedelta(seconds=10))
    receiver.respond = lambda request: Reply(status=200)
    admin.kit.drain_once("webhooks")

    recorded = attempts_of(admin.engine, row_id)

    assert [(entry["attempt"], entry["outcome"], entry["status_code"]) for entry in recorded] == [
        (1, "retry", 503),
        (2, "done", 200),
    ]
    assert "503" in recorded[0]["error"] and recorded[1]["error"] is None
    assert all(entry["outbox"] == "webhooks" for entry in recorded)
    assert all(entry["sender"] == f"{socket.gethostname()}:{os.getpid()}" for entry in recorded)
    assert all(entry["finished_at"] >= entry["started_at"] for entry in recorded)


def test_the_reason_a_row_got_stuck_survives_its_reset_on_the_row_page_and_api(admin, receiver):
    (row_id,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook"
    )
    receiver.respond = lambda request: Reply(status=422, body=b"amount must be positive")
    admin.kit.drain_once("webhooks")
    assert admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]}).status_code == 200
    receiver.respond = lambda request: Reply(status=200)
    admin.kit.drain_once("webhooks")

    detail = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()
    page = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}").text

    assert detail["status"] == "done" and detail["last_error"] is None
    history = detail["attempt_history"]
    assert [(entry["attempt"], entry["outcome"], entry["status_code"]) for entry in history] == [
        (2, "done", 200),
        (1, "reset", None),
        (1, "stuck", 422),
    ]
    assert "422" in history[2]["error"]
    assert history[0]["duration_ms"] >= 0
    assert 'id="attempt-history"' in page and "stuck" in page and "422" in page


def test_a_row_without_attempts_says_so(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    page = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}").text
    assert "No attempt recorded" in page


def test_retention_trims_attempts_older_than_the_limit_for_its_own_outbox_only(admin):
    now = admin.clock.now()
    with admin.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outboxkit_attempts (outbox, row_id, attempt, started_at, finished_at, outcome, sender) "
                "SELECT outbox, g, 1, :at - g * interval '1 day', :at - g * interval '1 day', 'done', 'test:1' "
                "FROM generate_series(1, 10) AS g, (VALUES ('webhooks'), ('credit-grants')) AS boxes(outbox)"
            ),
            {"at": now},
        )
    log = AttemptLog("webhooks", keep_days=2.5)
    log.add(AttemptRecord(row_id=99, attempt=1, started_at=now, finished_at=now, outcome="done", status_code=200, error=None))
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        log.flush(connection, now=now)
    with admin.engine.connect() as connection:
        kept = dict(connection.execute(text("SELECT outbox, count(*) FROM outboxkit_attempts GROUP BY outbox")).all())

    assert kept == {"webhooks": 3, "credit-grants": 10}  # days 1 and 2, plus the new one; the other outbox untouched


def test_a_history_of_zero_days_records_nothing(admin):
    log = AttemptLog("webhooks", keep_days=0)
    now = admin.clock.now()
    log.add(AttemptRecord(row_id=1, attempt=1, started_at=now, finished_at=now, outcome="done", status_code=200, error=None))
    assert not log.due(idle=True)
