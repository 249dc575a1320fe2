"""The Inbox page in headless Chromium: from the navigation to each source's received, duplicates and failures.

The served app is the example admin (module fixtures of test_admin_browser); each test names its own sources,
since the module's tests share the database.
"""

from __future__ import annotations

import uuid

import pytest

from outboxkit.inbox import InboxConsumer
from tests.browser.test_admin_browser import served  # noqa: F401  (fixture)
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)


def traffic(engine, source: str, *, handled: int, duplicates: int, failures: int) -> None:
    consumer = InboxConsumer(engine, source=source)
    for number in range(handled):
        consumer.consume(f"m-{number}", lambda session: None)
    for _ in range(duplicates):
        consumer.consume("m-0", lambda session: None)
    for _ in range(failures):
        with pytest.raises(ValueError):
            consumer.consume("bad", _refuse)


def _refuse(session: object) -> None:
    raise ValueError("amount <script>alert(1)</script> is negative")


@pytest.mark.parametrize("javascript", [False, True])
def test_the_inbox_page_shows_each_source_from_the_navigation(served, page_factory, javascript):
    base_url, harness = served
    billing, quiet = f"billing-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
    traffic(harness.engine, billing, handled=3, duplicates=2, failures=1)
    traffic(harness.engine, quiet, handled=1, duplicates=0, failures=0)
    page = page_factory(javascript=javascript)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page.goto(f"{base_url}/admin/")
    page.get_by_role("link", name="Inbox", exact=True).click()
    assert page.get_by_role("heading", level=1).inner_text() == "Inbox"
    row = page.locator(f'tr[data-source="{billing}"]')
    fields = ("received", "duplicates", "handler_failures")
    cells = {field: row.locator(f'td[data-field="{field}"]').inner_text() for field in fields}
    assert cells == {"received": "3", "duplicates": "2", "handler_failures": "1"}
    assert "ValueError: amount <script>alert(1)</script> is negative" in row.inner_text()  # shown as text, never run
    quiet_row = page.locator(f'tr[data-source="{quiet}"]')
    assert quiet_row.locator('td[data-field="duplicates"]').inner_text() == "0" and "—" in quiet_row.inner_text()
    assert dialogs == []
