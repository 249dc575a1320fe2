"""``outboxkit replay`` and ``outboxkit export``, run in-process against a real database (the example's kit)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from exampleapp.models import WebhookOutbox
from sqlalchemy import select, text

from outboxkit.cli import main
from outboxkit.storage.tables import reset_audit
from tests.support.admin import add_webhooks
from tests.support.database import sqlalchemy_url

APP = ["--app", "exampleapp.app:kit_from_environment"]


@pytest.fixture
def cli(database_url, monkeypatch, capsysbinary):
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))
    monkeypatch.setenv("COLUMNS", "300")  # usage errors are boxed to the terminal's width: keep messages on one line

    def run(*words: str) -> tuple[int, str, str]:
        code = main([*APP, *words])
        captured = capsysbinary.readouterr()
        return code, captured.out.decode(), captured.err.decode()

    return run


def statuses(engine) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(select(WebhookOutbox.id, WebhookOutbox.status)).all())


def audit_rows(engine) -> list[dict]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(select(reset_audit).order_by(reset_audit.c.id)).mappings()]


def test_replay_is_a_dry_run_by_default_and_changes_nothing(cli, engine):
    add_webhooks(engine, 3, status="done", error=None, status_code=200)
    before = statuses(engine)

    code, out, _ = cli("replay", "webhooks")
    assert code == 0 and "dry run: 3 delivered row(s) match; pass --yes" in out
    code, out, _ = cli("--json", "replay", "webhooks", "--dry-run")
    assert code == 0 and (json.loads(out)["matched"], json.loads(out)["replayed"]) == (3, 0)

    assert statuses(engine) == before and audit_rows(engine) == []


def test_replay_yes_replays_the_matching_rows_in_batches_and_is_audited(cli, engine):
    early = add_webhooks(engine, 3, status="done", error=None, status_code=200)
    late = add_webhooks(engine, 2, status="done", error=None, status_code=200)
    with engine.begin() as connection:
        connection.execute(text("UPDATE webhook_outbox SET delivered_at = '2030-01-01T00:00:00Z' WHERE id = ANY(:ids)"),
                           {"ids": early})
        connection.execute(text("UPDATE webhook_outbox SET delivered_at = '2030-02-01T00:00:00Z' WHERE id = ANY(:ids)"),
                           {"ids": late})

    code, out, err = cli("--json", "replay", "webhooks", "--delivered-before", "2030-01-15T00:00", "--yes", "--batch-size", "2")

    assert code == 0, err
    outcome = json.loads(out)
    assert (outcome["matched"], outcome["replayed"], outcome["batches"]) == (3, 3, 2)
    assert [statuses(engine)[row_id] for row_id in early + late] == ["pending"] * 3 + ["done"] * 2
    entries = audit_rows(engine)
    assert [(entry["action"], entry["row_count"]) for entry in entries] == [("replay", 2), ("replay", 1)]
    assert all(entry["actor"].startswith("cli:") for entry in entries)
    assert entries[0]["filter"]["delivered_before"] == "2030-01-15T00:00:00+00:00"


@pytest.mark.parametrize(
    ("words", "code", "message"),
    [
        (["replay", "nope", "--yes"], 1, "no outbox named 'nope'"),
        (["replay", "webhooks", "--yes", "--batch-size", "0"], 2, "batch-size"),
        (["replay", "webhooks", "--yes", "--batch-size", "100000"], 2, "batch-size"),
        (["replay", "webhooks", "--yes", "--delivered-after", "soon"], 2, "is not a time"),
        (["replay", "webhooks", "--yes", "--payload-column", "secret", "--payload-contains", "x"], 1, "payload_column"),
        (["replay", "webhooks", "--yes", "--dry-run"], 2, "pass one of them"),
        (["export", "webhooks", "--format", "xml"], 1, "format must be one of"),
        (["export", "webhooks", "--status", "lost"], 1, "status must be one of"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(cli, engine, words, code, message):
    add_webhooks(engine, 2, status="done", error=None, status_code=200)
    before = statuses(engine)
    exit_code, out, err = cli(*words)
    assert exit_code == code and message in err
    assert out == ""
    assert statuses(engine) == before and audit_rows(engine) == []


def test_export_writes_ndjson_to_standard_output(cli, engine):
    ids = add_webhooks(engine, 3, status="stuck", error="HTTP 400")
    add_webhooks(engine, 2, status="done", error=None, status_code=200)

    code, out, err = cli("export", "webhooks", "--status", "stuck")

    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [record["id"] for record in records] == ids
    assert {record["status"] for record in records} == {"stuck"}


def test_export_writes_spreadsheet_safe_csv_to_a_file(cli, engine, tmp_path):
    (row_id,) = add_webhooks(engine, 1, status="stuck", event="=cmd|' /C calc'!A0", error="-1, \"quoted\"")
    target = tmp_path / "stuck.csv"

    code, out, err = cli("export", "webhooks", "--format", "csv", "--error-contains", "quoted", "--output", str(target))

    assert code == 0 and out == "", err
    header, row = list(csv.reader(io.StringIO(target.read_text(encoding="utf-8"), newline="")))
    assert int(row[0]) == row_id
    assert row[header.index("event")] == "'=cmd|' /C calc'!A0"
    assert row[header.index("last_error")] == "'-1, \"quoted\""
