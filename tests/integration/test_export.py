"""Export: the rows matching a filter streamed as NDJSON or CSV, escaped, spreadsheet-safe, in constant memory."""

from __future__ import annotations

import csv
import io
import json
import threading
import tracemalloc

import psycopg
import pytest
from exampleapp.models import CreditGrantOutbox, WebhookOutbox
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.admin import create_admin_router
from outboxkit.operations.export import RowExport, spreadsheet_safe
from outboxkit.storage.row_filter import RowFilter
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    row_of,
    snapshot,
)
from tests.support.leadership import wait_until

EXPORT = "/admin/api/outboxes/webhooks/export"
KIT_COLUMNS = [
    "id", "idempotency_key", "status", "attempts", "next_attempt_at", "last_error", "last_status_code",
    "created_at", "updated_at", "delivered_at", "claimed_until", "claim_token", "destination",
]
HOSTILE_EVENTS = ["=HYPERLINK(\"http://evil\")", "+1", "-2", "@SUM(A1)", "\tcmd", "plain, with \"quotes\"\nand a newline"]


def test_ndjson_streams_every_matching_row_with_the_kit_and_payload_columns(admin):
    stuck = add_webhooks(admin.engine, 4, status="stuck", error="HTTP 400: bad amount", payload={"n": 7, "note": "é"})
    add_webhooks(admin.engine, 3, status="done", error=None, status_code=200)

    response = admin.client.get(EXPORT, params={"status": "stuck", "error_contains": "bad amount"})

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["content-disposition"] == 'attachment; filename="webhooks-stuck.ndjson"'
    assert response.headers["x-frame-options"] == "DENY"  # the admin's headers on the stream too
    lines = response.text.splitlines()
    records = [json.loads(line) for line in lines]
    assert [record["id"] for record in records] == stuck  # id order
    assert list(records[0]) == KIT_COLUMNS + ["event", "target_url", "payload"]
    first = row_of(admin.engine, stuck[0])
    assert records[0]["idempotency_key"] == str(first["idempotency_key"])
    assert records[0]["created_at"] == first["created_at"].isoformat()
    assert (records[0]["status"], records[0]["attempts"], records[0]["last_status_code"]) == ("stuck", 1, 400)
    assert records[0]["claim_token"] is None
    assert json.loads(records[0]["payload"]) == {"n": 7, "note": "é"}  # the application's columns as text


def test_csv_quotes_what_needs_quoting_and_defuses_spreadsheet_formulas(admin):
    ids = [add_webhooks(admin.engine, 1, status="stuck", event=event, error=event)[0] for event in HOSTILE_EVENTS]

    response = admin.client.get(EXPORT, params={"format": "csv"})

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.headers["content-disposition"] == 'attachment; filename="webhooks-all.csv"'
    assert response.text.endswith("\r\n")
    header, *rows = list(csv.reader(io.StringIO(response.text, newline="")))
    assert header == KIT_COLUMNS + ["event", "target_url", "payload"]
    assert [int(row[0]) for row in rows] == ids
    events = [row[header.index("event")] for row in rows]
    assert events == ["'" + event for event in HOSTILE_EVENTS[:5]] + [HOSTILE_EVENTS[5]]
    assert [row[header.index("last_error")] for row in rows] == events
    assert {row[header.index("claimed_until")] for row in rows} == {""}  # missing values are empty cells
    assert {row[header.index("attempts")] for row in rows} == {"1"}


def test_csv_writes_negative_numbers_of_number_columns_as_numbers(admin):
    with admin.engine.begin() as connection:
        grant = connection.execute(text("INSERT INTO grants (workspace, amount) VALUES ('-ws', -5) RETURNING id")).scalar()
        connection.execute(
            text("INSERT INTO credit_grant_outbox (grant_id, workspace, amount) VALUES (:grant, '-ws', -5), (:grant, '=x', 7)"),
            {"grant": grant},
        )

    response = admin.client.get("/admin/api/outboxes/credit-grants/export", params={"format": "csv"})

    assert response.status_code == 200
    header, *rows = list(csv.reader(io.StringIO(response.text, newline="")))
    assert [(row[header.index("amount")], row[header.index("workspace")]) for row in rows] == [("-5", "'-ws"), ("7", "'=x")]


def test_spreadsheet_safe_prefixes_only_formula_starts():
    assert [spreadsheet_safe(text) for text in ("=1", "+1", "-1", "@a", "\t", "\rx", "1-2", "a=b", "", "'=x")] == [
        "'=1", "'+1", "'-1", "'@a", "'\t", "'\rx", "1-2", "a=b", "", "'=x",
    ]


def test_the_export_walks_the_table_in_keyset_batches_without_losing_or_repeating_a_row(admin):
    ids = add_webhooks(admin.engine, 10, status="done", error=None, status_code=200)
    add_webhooks(admin.engine, 2, status="stuck")

    chunks = list(RowExport(admin.kit, batch_rows=3).open("webhooks", row_filter=RowFilter(), status="done", format="ndjson"))

    assert len(chunks) == 4  # 3 + 3 + 3 + 1
    assert [json.loads(line)["id"] for chunk in chunks for line in chunk.decode().splitlines()] == ids


def test_an_empty_export_is_a_csv_header_or_an_empty_body(admin):
    csv_body = admin.client.get(EXPORT, params={"format": "csv", "status": "stuck"})
    ndjson_body = admin.client.get(EXPORT, params={"status": "stuck"})
    assert csv_body.status_code == ndjson_body.status_code == 200
    assert csv_body.text.startswith("id,idempotency_key,") and csv_body.text.count("\r\n") == 1
    assert ndjson_body.text == ""


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"format": "xml"}, 422),
        ({"status": "lost"}, 422),
        ({"delivered_after": "soon"}, 422),
        ({"attempts_min": "²"}, 422),
        ({"payload_column": "secret", "payload_contains": "x"}, 422),
        ({"error_contains": "a\x00b"}, 422),
    ],
)
def test_bad_export_input_is_a_clear_422_before_anything_streams(admin, query, status):
    add_webhooks(admin.engine, 2, status="stuck")
    response = admin.client.get(EXPORT, params=query)
    assert response.status_code == status
    assert response.json()["detail"]


def test_an_unknown_outbox_is_a_404(admin):
    response = admin.client.get("/admin/api/outboxes/nope/export")
    assert response.status_code == 404 and "nope" in response.json()["detail"]


def test_the_rows_page_links_its_filtered_export(admin):
    add_webhooks(admin.engine, 1, status="stuck", error="timeout")
    page = admin.client.get("/admin/outboxes/webhooks", params={"status": "stuck", "error_contains": "timeout"}).text
    assert "/admin/api/outboxes/webhooks/export?error_contains=timeout&amp;status=stuck&amp;format=csv" in page
    assert "/admin/api/outboxes/webhooks/export?error_contains=timeout&amp;status=stuck&amp;format=ndjson" in page


@pytest.mark.parametrize(
    "total_rows",
    [pytest.param(20_000, id="20k"), pytest.param(50_000, id="50k", marks=pytest.mark.slow)],
)
def test_exporting_many_rows_holds_one_batch_in_memory_whatever_the_number_of_rows(admin, total_rows):
    """The first 5,000 rows set the working size; the rest (three times as many by default, nine times in the
    slow variant) need no more, and the whole run stays below what it exported."""
    add_webhooks(admin.engine, total_rows, status="done", error=None, status_code=200, payload={"text": "x" * 200})
    before = snapshot(admin.engine)

    for export_format in ("ndjson", "csv"):
        chunks = RowExport(admin.kit).open("webhooks", row_filter=RowFilter(), status=None, format=export_format)
        exported_bytes = exported_lines = 0
        tracemalloc.start()
        try:
            for index, chunk in enumerate(chunks):
                exported_bytes += len(chunk)
                exported_lines += chunk.count(b"\n")
                if index == 4:  # the first 5,000 rows set the working size
                    _, early_peak = tracemalloc.get_traced_memory()
                    tracemalloc.reset_peak()
            _, later_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()

        assert exported_lines == total_rows + (1 if export_format == "csv" else 0)
        assert exported_bytes > 400 * total_rows  # 20+ MB for 50,000 rows
        # Loose bounds: the rows after the first 5,000 need no more memory than those did (twice, for noise), and
        # the whole run stays below what it exported (one 1,000-row batch at a time): far below, 10 MB for the
        # 20+ MB of 50,000 rows; for fewer rows, below half of what they were.
        assert later_peak < 2 * early_peak, f"{export_format}: peak {later_peak:,} after the first batches' {early_peak:,}"
        bound = min(10_000_000, exported_bytes // 2)
        assert max(early_peak, later_peak) < bound, f"{export_format}: peak {later_peak:,} for {exported_bytes:,} bytes"
        print(f"{export_format}: {total_rows} rows, {exported_bytes:,} bytes, peaks {early_peak:,} / {later_peak:,}")
    assert snapshot(admin.engine) == before  # an export changes nothing


def test_exports_past_max_exports_get_a_429_at_once_until_one_ends(admin, admin_database_url):
    add_webhooks(admin.engine, 3, status="stuck")
    # The admin's time limit is raised so the held export waits for the test, not for the limit.
    settings = OutboxKitSettings(admin_statement_timeout_seconds=120)
    kit = OutboxKit(admin.engine, [CreditGrantOutbox, WebhookOutbox], settings=settings)
    app = FastAPI()
    app.include_router(create_admin_router(kit, dependencies=[Depends(lambda: None)], max_exports=1), prefix="/admin")
    held: list[object] = []
    try:
        with TestClient(app) as client, psycopg.connect(admin_database_url, autocommit=True) as blocker:
            with blocker.transaction():
                blocker.execute("LOCK TABLE webhook_outbox IN ACCESS EXCLUSIVE MODE")  # the first export's read waits
                first = threading.Thread(target=lambda: held.append(client.get(EXPORT)))
                first.start()
                wait_until(lambda: _export_waiting_on_the_lock(blocker), timeout=30, message="the first export waiting")
                refused = client.get(EXPORT, params={"format": "csv"})
                assert refused.status_code == 429 and "max_exports" in refused.json()["detail"]
                assert refused.headers["retry-after"] and refused.headers["x-frame-options"] == "DENY"
            first.join(30)
            assert [response.status_code for response in held] == [200]
            assert len(held[0].text.splitlines()) == 3
            assert client.get(EXPORT).status_code == 200  # the slot came back when the stream ended
    finally:
        kit.close()


def _export_waiting_on_the_lock(connection: psycopg.Connection) -> bool:
    waiting = "SELECT count(*) FROM pg_locks WHERE relation = 'webhook_outbox'::regclass AND NOT granted"
    row = connection.execute(waiting).fetchone()
    return bool(row and row[0])
