"""Each attempt keeps what it sent and what came back (real receiver, real database); numbers count on across
resets, and each reset leaves a marker in the history, on the row page and in the API."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from sqlalchemy import text

from outboxkit import ManualClock, OutboxKitSettings
from outboxkit.storage.attempts import AttemptLog, AttemptRecord
from outboxkit.transports.base import Delivery
from outboxkit.transports.http import HttpTransport
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    empty_tables,
)
from tests.support.receiver import Reply


def history(engine, row_id: int) -> list[dict]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT attempt, outcome, status_code, sender, request, response FROM outboxkit_attempts "
                 "WHERE row_id = :id ORDER BY id"),
            {"id": row_id},
        )
        return [dict(row._mapping) for row in rows]


def sent_body(row_payload: dict) -> bytes:
    body = Delivery(url="http://127.0.0.1/", json={"event": "grant.created", "data": row_payload}).body()
    assert body is not None
    return body


def test_an_attempt_keeps_its_request_redacted_and_the_answer_and_not_the_body_by_default(admin_database_url, receiver):
    empty_tables(admin_database_url)
    transport = HttpTransport(trust_env=False, headers={"Authorization": "Bearer s3cret-token"})
    with admin_harness(admin_database_url, clock=ManualClock(START), transport=transport) as harness:
        (row_id,) = add_webhooks(
            harness.engine, 1, status="pending", attempts=0, error=None, status_code=None,
            target_url=receiver.url + "/hook?token=abc123&page=2", payload={"amount": 5},
        )
        receiver.respond = lambda request: Reply(
            status=503, headers={"Retry-After": "1", "X-Request-Id": "req-42", "X-Secret-Internal": "no"},
            body=b"busy, come back later",
        )
        harness.kit.drain_once("webhooks")
        [entry] = history(harness.engine, row_id)

    assert receiver.requests[0].headers["Authorization"] == "Bearer s3cret-token"  # sent as it is
    request, response = entry["request"], entry["response"]
    assert request["method"] == "POST"
    assert request["url"] == receiver.url + "/hook?token=[redacted]&page=2"
    headers = dict(request["headers"])
    assert headers["Authorization"] == "[redacted]" and headers["Content-Type"] == "application/json"
    assert headers["Idempotency-Key"] == receiver.requests[0].key
    body = sent_body({"amount": 5})
    assert (request["body_size"], request["body_sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    assert request["body"] is None
    assert response["status"] == 503 and response["body"] == "busy, come back later"
    assert dict(response["headers"])["X-Request-Id"] == "req-42" and "X-Secret-Internal" not in dict(response["headers"])
    assert "s3cret" not in json.dumps(entry["request"]) and "abc123" not in json.dumps(entry["request"])


def test_the_body_is_kept_up_to_the_opted_in_limit(admin_database_url, receiver):
    empty_tables(admin_database_url)
    settings = OutboxKitSettings(attempt_body_bytes=20)
    with admin_harness(admin_database_url, clock=ManualClock(START), settings=settings) as harness:
        (row_id,) = add_webhooks(
            harness.engine, 1, status="pending", attempts=0, error=None, status_code=None,
            target_url=receiver.url + "/hook", payload={"amount": 5},
        )
        harness.kit.drain_once("webhooks")
        [entry] = history(harness.engine, row_id)
    body = sent_body({"amount": 5})
    assert entry["request"]["body"] == body[:20].decode() and entry["request"]["body_truncated"] is True
    assert entry["request"]["body_size"] == len(body)


def test_attempts_count_on_across_resets_and_each_reset_is_a_marker_in_the_api(admin, receiver):
    (row_id,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook"
    )
    receiver.respond = lambda request: Reply(status=422, body=b"amount must be positive")
    admin.kit.drain_once("webhooks")  # 1: stuck
    assert admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]}).status_code == 200
    receiver.respond = lambda request: Reply(status=503)
    admin.clock.advance(timedelta(seconds=1))
    admin.kit.drain_once("webhooks")  # 2: retry
    admin.clock.advance(timedelta(seconds=10))
    receiver.respond = lambda request: Reply(status=422)
    admin.kit.drain_once("webhooks")  # 3: stuck
    reset = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"status_code": 422, "dry_run": False})
    assert reset.status_code == 200 and reset.json()["changed"] == 1
    admin.clock.advance(timedelta(seconds=1))
    receiver.respond = lambda request: Reply(status=200, headers={"Content-Type": "application/json"}, body=b'{"ok":true}')
    admin.kit.drain_once("webhooks")  # 4: done

    detail = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()

    assert detail["status"] == "done" and detail["attempts"] == 1  # the retry budget started again at the reset
    entries = detail["attempt_history"]
    assert [(entry["attempt"], entry["outcome"], entry["status_code"]) for entry in entries] == [
        (4, "done", 200),
        (3, "reset", None),
        (3, "stuck", 422),
        (2, "retry", 503),
        (1, "reset", None),
        (1, "stuck", 422),
    ]
    assert entries[1]["sender"] == entries[4]["sender"] == "admin"
    assert entries[1]["request"] is None and entries[1]["response"] is None
    assert entries[0]["response"] == {
        "status": 200, "headers": [["Content-Type", "application/json"], ["Content-Length", "11"]],
        "body": '{"ok":true}', "body_size": 11, "body_truncated": False,
    }
    assert entries[0]["request"]["method"] == "POST" and entries[0]["request"]["url"] == receiver.url + "/hook"
    assert entries[5]["response"]["body"] == "amount must be positive"


def test_a_refused_connection_keeps_what_was_sent_and_no_answer(admin):
    (row_id,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url="http://127.0.0.1:9/hook"
    )
    admin.kit.drain_once("webhooks")  # nothing listens on port 9: a refused connection
    [entry] = history(admin.engine, row_id)
    assert entry["outcome"] == "retry" and entry["response"] is None
    assert entry["request"]["url"] == "http://127.0.0.1:9/hook"


def test_a_replay_is_marked_like_a_reset_and_the_numbers_count_on(admin, receiver):
    (row_id,) = add_webhooks(
        admin.engine, 1, status="pending", attempts=0, error=None, status_code=None, target_url=receiver.url + "/hook"
    )
    admin.kit.drain_once("webhooks")  # 1: done
    replay = admin.client.post("/admin/api/outboxes/webhooks/replay", json={"dry_run": False})
    assert replay.status_code == 200 and replay.json()["replayed"] == 1
    admin.clock.advance(timedelta(seconds=1))
    admin.kit.drain_once("webhooks")  # 2: done again

    entries = admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()["attempt_history"]
    assert [(entry["attempt"], entry["outcome"]) for entry in entries] == [(2, "done"), (1, "reset"), (1, "done")]


def test_a_reset_counts_for_the_attempts_claimed_after_it_by_the_servers_time_not_the_senders_clock(admin):
    now = admin.clock.now()
    with admin.engine.begin() as connection:  # a reset of row 7 at now + 5 s, after its attempts 1 and 2
        connection.execute(
            text("INSERT INTO outboxkit_attempts (outbox, row_id, attempt, started_at, finished_at, outcome, sender) "
                 "VALUES ('webhooks', 7, 2, :at, :at, 'reset', 'admin')"),
            {"at": now + timedelta(seconds=5)},
        )
    log = AttemptLog("webhooks", keep_days=7)
    second = timedelta(seconds=1)
    # Claimed before the reset (the reset came while its outcome waited to be written), by a host whose clock is ahead.
    log.add(AttemptRecord(row_id=7, attempt=3, started_at=now + 10 * second, finished_at=now + 11 * second,
                          outcome="stuck", status_code=422, error=None, claimed_at=now))
    # Claimed after the reset, by a host whose clock is behind the server's.
    log.add(AttemptRecord(row_id=7, attempt=1, started_at=now + 4 * second, finished_at=now + 4 * second,
                          outcome="done", status_code=200, error=None, claimed_at=now + 6 * second))
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        log.flush(connection, now=now)
    numbers = [(entry["attempt"], entry["outcome"]) for entry in history(admin.engine, 7)]
    assert numbers == [(2, "reset"), (3, "stuck"), (3, "done")]


def test_without_migration_outboxkit_0019_a_reset_says_which_migration_to_run_and_changes_nothing(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck", attempts=3)
    constraint = "ck_outboxkit_attempts_outcome"

    def set_check(outcomes: str) -> None:
        with admin.engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE outboxkit_attempts DROP CONSTRAINT {constraint}"))
            check = f"CHECK (outcome IN ({outcomes}))"
            connection.execute(text(f"ALTER TABLE outboxkit_attempts ADD CONSTRAINT {constraint} {check}"))

    set_check("'done', 'retry', 'stuck', 'lost'")
    try:
        one = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
        matching = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"dry_run": False})
        for answer in (one, matching):
            assert answer.status_code == 503 and "outboxkit_0019" in answer.text  # a clear refusal, not a 500
        with admin.engine.connect() as connection:
            row = connection.execute(text("SELECT status, attempts FROM webhook_outbox WHERE id = :id"), {"id": row_id}).one()
        assert tuple(row) == ("stuck", 3)
        assert history(admin.engine, row_id) == []
    finally:
        set_check("'done', 'retry', 'stuck', 'lost', 'reset'")
