"""Discarding stuck rows: kept with the terminal status ``discarded``, audited, out of the stuck count and the drain,
and brought back by a reset; singly and by filter with a dry run, from the API and the CLI."""

from __future__ import annotations

import json

from exampleapp.models import WebhookOutbox
from sqlalchemy import func, select

from outboxkit.storage.tables import reset_audit
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    audit_entries,
    empty_tables,
    row_of,
    snapshot,
)
from tests.support.cli import cli_fixture

cli = cli_fixture(["--app", "exampleapp.app:kit_from_environment"])


def webhook_counts(admin) -> dict[str, object]:
    overview = admin.client.get("/admin/api/outboxes").json()["outboxes"]
    return next(box for box in overview if box["name"] == "webhooks")["counts"]


def test_a_discarded_row_is_kept_audited_out_of_the_stuck_count_and_a_reset_brings_it_back(admin):
    gone, kept = add_webhooks(admin.engine, 2, status="stuck", error="HTTP 404 customer deleted", status_code=404)
    (pending,) = add_webhooks(admin.engine, 1, status="pending")

    result = admin.client.post("/admin/api/outboxes/webhooks/discard", json={"ids": [gone, pending]}).json()

    assert result["changed_ids"] == [gone]
    assert result["skipped"] == [{"id": pending, "reason": "status is pending; only stuck rows are discarded"}]
    row = row_of(admin.engine, gone)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("discarded", 1, 404)
    assert webhook_counts(admin)["stuck"] == 1
    entry = audit_entries(admin.engine)[-1]
    assert (entry["action"], entry["row_ids"]) == ("discard", [gone])
    listed = admin.client.get("/admin/api/outboxes/webhooks/rows", params={"status": "discarded"}).json()
    assert [listed_row["id"] for listed_row in listed["rows"]] == [gone]

    again = admin.client.post("/admin/api/outboxes/webhooks/discard", json={"ids": [gone]}).json()
    assert again["changed"] == 0 and again["skipped"][0]["reason"] == "already discarded"

    back = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [gone]}).json()
    assert back["changed_ids"] == [gone]
    assert (row_of(admin.engine, gone)["status"], row_of(admin.engine, gone)["attempts"]) == ("pending", 0)
    assert row_of(admin.engine, kept)["status"] == "stuck"


def test_discard_matching_counts_first_then_discards_only_the_matching_stuck_rows(admin):
    gone = add_webhooks(admin.engine, 3, status="stuck", error="HTTP 410 gone", status_code=410)
    (other,) = add_webhooks(admin.engine, 1, status="stuck", error="HTTP 400 bad request", status_code=400)
    before = snapshot(admin.engine)
    url = "/admin/api/outboxes/webhooks/discard-matching"

    preview = admin.client.post(url, json={"status_code": 410}).json()
    assert (preview["dry_run"], preview["matched"], preview["changed"]) == (True, 3, 0)
    assert snapshot(admin.engine) == before

    applied = admin.client.post(url, json={"status_code": 410, "dry_run": False}).json()
    assert applied["changed"] == 3
    assert {row_of(admin.engine, row_id)["status"] for row_id in gone} == {"discarded"}
    assert row_of(admin.engine, other)["status"] == "stuck"
    entry = audit_entries(admin.engine)[-1]
    assert entry["action"] == "discard" and sorted(entry["row_ids"]) == gone
    assert entry["filter"] == {"error_contains": None, "status_code": 410}


def test_the_cli_discards_by_id_and_by_filter_with_a_dry_run(cli, engine):
    (one,) = add_webhooks(engine, 1, status_code=404)
    many = add_webhooks(engine, 2, status_code=410, error="HTTP 410")

    code, out, _ = cli("discard", "webhooks", str(one))
    assert code == 0, out
    code, out, _ = cli("--json", "discard", "webhooks", "--all", "--status-code", "410", "--dry-run")
    assert code == 0 and json.loads(out)["matched"] == 2
    code, _, err = cli("discard", "webhooks", "--all", "--status-code", "410")
    assert code == 1 and "--yes" in err
    code, out, _ = cli("--json", "discard", "webhooks", "--all", "--status-code", "410", "--yes")
    assert code == 0 and json.loads(out)["changed"] == 2

    with engine.connect() as connection:
        statuses = dict(connection.execute(select(WebhookOutbox.id, WebhookOutbox.status)).all())
        actions = connection.execute(select(reset_audit.c.action, func.count()).group_by(reset_audit.c.action)).all()
    assert statuses == {one: "discarded", **{row_id: "discarded" for row_id in many}}
    assert dict(actions) == {"discard": 2}
    code, out, _ = cli("--json", "status")
    assert {box["name"]: box["counts"]["stuck"] for box in json.loads(out)["outboxes"]}["webhooks"] == 0


def test_a_table_without_the_status_says_which_migration_to_run_and_changes_nothing(admin):
    from sqlalchemy import text

    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    with admin.engine.begin() as connection:  # the table as an application created it before the status existed
        connection.execute(text("ALTER TABLE webhook_outbox DROP CONSTRAINT ck_webhook_outbox_status"))
        connection.execute(text(
            "ALTER TABLE webhook_outbox ADD CONSTRAINT ck_webhook_outbox_status CHECK (status IN ('pending', 'done', 'stuck'))"
        ))
    before = snapshot(admin.engine)

    response = admin.client.post("/admin/api/outboxes/webhooks/discard", json={"ids": [row_id]})
    matching = admin.client.post("/admin/api/outboxes/webhooks/discard-matching", json={"dry_run": False})

    assert response.status_code == 503 and "allow_discarded" in response.json()["detail"]
    assert matching.status_code == 503 and "allow_discarded" in matching.json()["detail"]
    assert snapshot(admin.engine) == before and audit_entries(admin.engine) == []
