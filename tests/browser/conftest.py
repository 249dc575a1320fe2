"""The browser tests' Chromium: one headless browser for the whole folder, a fresh context per page.

Launching Chromium costs about a second; each test still gets contexts of its
own (cookies, storage, JavaScript on or off, timezone), closed after it, so
sharing the browser shares no state between tests.  Without /usr/bin/chromium
these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER
from tests.support.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page_factory(browser):
    contexts = []

    def open_page(*, javascript: bool = False, timezone_id: str | None = None):
        zone = {"timezone_id": timezone_id} if timezone_id else {}  # the browser's own timezone, e.g. America/New_York
        context = browser.new_context(
            http_credentials={"username": ADMIN_USER, "password": ADMIN_PASSWORD}, java_script_enabled=javascript, **zone
        )
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()
