"""The row page in a real headless Chromium (no JavaScript): each attempt opens to what it sent and what came
back, secrets redacted, and a reset stands in the attempt list as a marker, the numbers counting on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outboxkit import ManualClock, OutboxKitSettings
from outboxkit.transports.http import HttpTransport
from tests.support.admin import (
    START,
    ServedApp,
    add_webhooks,
    admin_database_url,  # noqa: F401  (fixture)
    admin_harness,
    empty_tables,
)
from tests.support.chromium import require_chromium
from tests.support.receiver import Reply


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, object]]:
    require_chromium()
    empty_tables(admin_database_url)
    transport = HttpTransport(trust_env=False, headers={"Authorization": "Bearer s3cret-token"})
    settings = OutboxKitSettings(attempt_body_bytes=200)
    with (
        admin_harness(admin_database_url, clock=ManualClock(START), transport=transport, settings=settings) as harness,
        ServedApp(harness.app) as base_url,
    ):
        yield base_url, harness


def test_the_row_page_shows_each_attempts_request_and_response_and_the_reset_marker(served, page_factory, receiver):
    base_url, harness = served
    receiver.respond = lambda request: Reply(status=422, headers={"X-Request-Id": "req-1"}, body=b"amount must be positive")
    (row_id,) = add_webhooks(
        harness.engine, 1, status="pending", error=None, status_code=None, attempts=0,
        target_url=receiver.url + "/hook?token=abc123", payload={"amount": -5},
    )
    assert harness.kit.drain_once("webhooks").stuck == 1
    page = page_factory()
    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")
    page.get_by_role("button", name="Reset this row").click()
    page.get_by_role("status").wait_for()
    receiver.respond = lambda request: Reply(status=200, headers={"Content-Type": "application/json"}, body=b'{"ok":true}')
    assert harness.kit.drain_once("webhooks").delivered == 1
    page.reload()

    history = page.locator("#attempt-history")
    numbers = history.locator(":scope > tbody > tr.attempt").evaluate_all("rows => rows.map(row => row.dataset.attempt)")
    assert numbers == ["2", "1"]
    marker = history.locator("tr.reset-marker")
    assert marker.count() == 1
    assert "reset" in marker.inner_text() and "by admin after attempt 1" in " ".join(marker.inner_text().split())
    # The marker stands between the two attempts.
    order = history.locator(":scope > tbody > tr:not(.attempt-exchange)").evaluate_all("rows => rows.map(row => row.className)")
    assert order == ["attempt", "reset-marker", "attempt"]

    details = page.locator("tr.attempt-exchange[data-attempt='2'] details")
    assert not details.locator("pre.response-body").is_visible()  # closed until asked
    details.get_by_text("Request and response of attempt 2").click()
    assert details.locator(".request-line").inner_text() == f"POST {receiver.url}/hook?token=[redacted]"
    request_headers = details.locator("table.request-headers").inner_text()
    assert "Authorization\t[redacted]" in request_headers and "s3cret" not in request_headers
    assert details.locator("pre.request-body").inner_text() == '{"event":"grant.created","data":{"amount":-5}}'
    assert len(details.locator(".body-sha256").inner_text()) == 64
    assert details.locator(".response-status").inner_text() == "HTTP 200"
    assert details.locator("pre.response-body").inner_text() == '{"ok":true}'

    first = page.locator("tr.attempt-exchange[data-attempt='1'] details")
    first.get_by_text("Request and response of attempt 1").click()
    assert first.locator("pre.response-body").inner_text() == "amount must be positive"
    assert "X-Request-Id\treq-1" in first.locator("table.response-headers").inner_text()
    shown = history.inner_html()  # the row's own target_url column is the application's, shown as it is stored
    assert "s3cret" not in shown and "abc123" not in shown
