"""Replay and export in headless Chromium with JavaScript off: the confirmation page, the replay, the download.

The served app is the example admin on a real clock (module fixtures of
test_admin_browser); each test marks its rows with a unique event name and
filters on it, since the module's tests share the database.
"""

from __future__ import annotations

import csv
import io
import re
import uuid
from collections import Counter
from pathlib import Path

from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import add_webhooks, admin_database_url, audit_entries, row_of  # noqa: F401  (fixture)


def test_replay_from_the_done_tab_asks_with_the_dry_run_count_then_sends_the_rows_again(served, page_factory, receiver):
    base_url, harness = served
    mark = f"replay-{uuid.uuid4().hex[:8]}"
    ids = add_webhooks(harness.engine, 3, status="pending", attempts=0, error=None, status_code=None,
                       target_url=receiver.url + "/hook", event=mark)
    add_webhooks(harness.engine, 2, status="done", error=None, status_code=200, event="grant.created")
    assert harness.kit.drain_once("webhooks").delivered == 3
    audited_before = len(audit_entries(harness.engine))
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=done&payload_column=event&payload_contains={mark}")
    page.get_by_role("link", name="Replay matching…").click()
    assert re.search(r"3\s+delivered row\(s\) match now", page.locator("#replay-count").inner_text())
    assert [row_of(harness.engine, row_id)["status"] for row_id in ids] == ["done"] * 3  # asking changed nothing

    page.get_by_label("Rows per batch").fill("2")
    page.get_by_role("button", name="Replay 3 row(s)").click()

    assert "Replayed 3 delivered row(s)" in page.get_by_role("status").inner_text()
    assert page.url.endswith("/admin/outboxes/webhooks?status=pending")
    entries = audit_entries(harness.engine)[audited_before:]
    assert [(entry["action"], entry["row_count"]) for entry in entries] == [("replay", 2), ("replay", 1)]
    assert harness.kit.drain_once("webhooks").delivered == 3
    assert sorted(Counter(request.key for request in receiver.requests).values()) == [2, 2, 2]  # same key, twice


def test_the_rows_page_downloads_its_filtered_rows_as_csv(served, page_factory):
    base_url, harness = served
    mark = f"export-{uuid.uuid4().hex[:8]}"
    ids = add_webhooks(harness.engine, 2, status="stuck", error=f"={mark}")
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck&error_contains={mark}")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="CSV", exact=True).click()
    download = download_info.value

    assert download.suggested_filename == "webhooks-stuck.csv"
    header, *rows = list(csv.reader(io.StringIO(Path(download.path()).read_text(encoding="utf-8"), newline="")))
    assert [int(row[0]) for row in rows] == ids
    assert {row[header.index("last_error")] for row in rows} == {f"'={mark}"}
