"""The admin in a real headless Chromium: find a stuck row, reset it, watch it deliver.

The example admin app runs under uvicorn in a thread on a free 127.0.0.1
port; the browser signs in with HTTP Basic.  The main flows run with
JavaScript disabled, which proves the pages need none; the attacks (framing
the admin from another port, script in stored row data) run with it enabled.  Without
/usr/bin/chromium these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.support.admin import (
    ServedApp,
    add_webhooks,
    admin_database_url,  # noqa: F401  (fixture)
    admin_harness,
    empty_tables,
    row_of,
)
from tests.support.chromium import require_chromium
from tests.support.receiver import Reply


@pytest.fixture(scope="module")
def served(admin_database_url) -> Iterator[tuple[str, object]]:
    require_chromium()
    empty_tables(admin_database_url)
    with admin_harness(admin_database_url) as harness, ServedApp(harness.app) as base_url:
        yield base_url, harness


def test_reset_a_stuck_row_and_watch_it_deliver(served, page_factory, receiver):
    base_url, harness = served
    receiver.respond = lambda request: Reply(status=400, body=b"amount must be positive")
    (row_id,) = add_webhooks(
        harness.engine,
        1,
        status="pending",
        error=None,
        status_code=None,
        attempts=0,
        target_url=receiver.url + "/hook",
        payload={"amount": -5},
    )
    assert harness.kit.drain_once("webhooks").stuck == 1
    page = page_factory()

    page.goto(f"{base_url}/admin/")
    page.get_by_role("link", name="webhooks").first.wait_for()
    page.locator('a[href="/admin/outboxes/webhooks?status=stuck"]').click()
    page.get_by_role("link", name=str(row_id), exact=True).click()
    assert page.locator("#row-status").inner_text().startswith("stuck")
    assert "400" in page.locator("dl.facts").first.inner_text()

    page.get_by_role("button", name="Reset this row").click()
    page.get_by_role("status").wait_for()
    assert "Reset: the row is pending" in page.get_by_role("status").inner_text()
    assert page.locator("#row-status").inner_text().startswith("pending")

    receiver.respond = lambda request: Reply(status=200)
    assert harness.kit.drain_once("webhooks").delivered == 1
    page.reload()
    assert page.locator("#row-status").inner_text().startswith("done")
    assert row_of(harness.engine, row_id)["status"] == "done"


def test_bulk_reset_shows_the_dry_run_count_before_resetting(served, page_factory):
    base_url, harness = served
    matching = add_webhooks(harness.engine, 3, status="stuck", error="HTTP 422: bad amount")
    other = add_webhooks(harness.engine, 2, status="stuck", error="HTTP 404: no such workspace")
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
    page.get_by_label("Error contains").fill("bad amount")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name="Reset all matching…").click()
    assert re.search(r"\b3 stuck row\(s\) match now", page.locator("#dry-run-count").inner_text())
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"stuck"}

    page.get_by_role("button", name="Reset 3 row(s)").click()
    assert "Reset 3 row(s)" in page.get_by_role("status").inner_text()
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"pending"}
    assert {row_of(harness.engine, row_id)["status"] for row_id in other} == {"stuck"}


def test_a_form_posted_without_its_csrf_token_is_refused(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck")
    page = page_factory(javascript=True)

    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")
    page.evaluate("document.querySelectorAll('input[name=csrf_token]').forEach((field) => field.remove())")
    page.get_by_role("button", name="Reset this row").click()

    assert "security token is missing, invalid or expired" in page.get_by_role("alert").inner_text()
    assert row_of(harness.engine, row_id)["status"] == "stuck"


def test_the_admin_cannot_be_framed_by_another_page(served, page_factory):
    """A page on another local port frames a row page (a clickjacking setup): the browser shows nothing of it."""
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck")
    target = f"{base_url}/admin/outboxes/webhooks/rows/{row_id}"

    def bait(request):
        return HTMLResponse(
            f'<h1>Win a prize</h1><iframe id="victim" src="{target}"></iframe><iframe id="own" src="/own"></iframe>'
        )

    def own(request):
        return HTMLResponse('<p id="own">a frame this page may show</p>')

    framer = Starlette(routes=[Route("/", bait), Route("/own", own)])
    with ServedApp(framer) as framer_url:
        page = page_factory(javascript=True)
        refusal = page.expect_console_message(lambda message: "frame-ancestors" in message.text)
        answer = page.expect_response(lambda response: response.url == target and response.status == 200)
        with refusal as refused, answer as admin_answer:
            page.goto(framer_url + "/")
        assert admin_answer.value.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in refused.value.text
        page.frame_locator("#own").locator("#own").wait_for()  # framing itself works in this page

        victim = page.locator("#victim").element_handle().content_frame()
        victim.wait_for_load_state()
        assert victim.url != target  # Chromium swaps a refused frame for its error page
        assert victim.locator("text=Reset this row").count() == 0
    assert row_of(harness.engine, row_id)["status"] == "stuck"


def test_no_script_runs_from_stored_row_data(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(
        harness.engine,
        1,
        status="stuck",
        payload={"note": "<script>window.pwned = 'payload'</script>", "html": '"><img src=x onerror="window.pwned=\'attr\'">'},
        error="<img src=x onerror=\"window.pwned='error'\"><script>window.pwned='error script'</script>",
        event="<svg onload=\"window.pwned='event'\">",
    )
    page = page_factory(javascript=True)
    for path in (f"/admin/outboxes/webhooks/rows/{row_id}", "/admin/outboxes/webhooks?status=stuck"):
        page.goto(base_url + path)
        page.wait_for_load_state("load")
        assert page.evaluate("() => window.pwned") is None, path
    page.goto(base_url + f"/admin/outboxes/webhooks/rows/{row_id}")
    assert "<script>window.pwned = 'payload'</script>" in page.locator("dl.payload").inner_text()  # shown as text

    # Even markup that escaped the escaping would not run: the policy blocks inline script and handlers.
    blocked = page.evaluate(
        """() => new Promise((resolve) => {
            const seen = [];
            document.addEventListener('securitypolicyviolation', (event) => {
                seen.push(event.effectiveDirective);
                if (seen.length === 2) resolve(seen);
            });
            const script = document.createElement('script');
            script.textContent = "window.pwned = 'inline'";
            document.body.appendChild(script);
            const holder = document.createElement('div');
            holder.innerHTML = '<img src="/admin/static/nothing.png" onerror="window.pwned = \\'handler\\'">';
            document.body.appendChild(holder);
        })"""
    )
    assert sorted(blocked) == ["script-src-attr", "script-src-elem"]
    assert page.evaluate("() => window.pwned") is None


def test_discard_a_row_from_its_page_find_it_under_discarded_and_reset_it(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck", error="HTTP 404: no such customer", status_code=404)
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")
    page.get_by_role("button", name="Discard this row").click()
    assert "Discarded: the row is kept" in page.get_by_role("status").inner_text()
    assert page.locator("#row-status").inner_text().startswith("discarded")

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=discarded")
    assert re.search(r"discarded\s+1", page.get_by_role("navigation", name="status").inner_text())
    page.get_by_role("link", name=str(row_id), exact=True).click()
    page.get_by_role("button", name="Reset this row").click()
    assert page.locator("#row-status").inner_text().startswith("pending")
    assert row_of(harness.engine, row_id)["status"] == "pending"


def test_discard_all_matching_shows_the_dry_run_count_first(served, page_factory):
    base_url, harness = served
    matching = add_webhooks(harness.engine, 2, status="stuck", error="HTTP 410: retired event type", status_code=410)
    (other,) = add_webhooks(harness.engine, 1, status="stuck", error="HTTP 422: bad amount", status_code=422)
    page = page_factory()

    page.goto(f"{base_url}/admin/outboxes/webhooks?status=stuck")
    page.get_by_label("Error contains").fill("retired event")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name="Discard all matching…").click()
    assert re.search(r"\b2 stuck row\(s\) match now", page.locator("#dry-run-count").inner_text())
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"stuck"}

    page.get_by_role("button", name="Discard 2 row(s)").click()
    assert "Discarded 2 row(s)" in page.get_by_role("status").inner_text()
    assert {row_of(harness.engine, row_id)["status"] for row_id in matching} == {"discarded"}
    assert row_of(harness.engine, other)["status"] == "stuck"


def test_a_relative_time_sits_on_the_line_of_the_time_it_describes(served, page_factory):
    base_url, harness = served
    (row_id,) = add_webhooks(harness.engine, 1, status="stuck")
    page = page_factory()
    page.goto(f"{base_url}/admin/outboxes/webhooks/rows/{row_id}")

    created = page.locator("dt:text-is('Created') + dd .when")
    relative, stamp = created.locator("time").bounding_box(), created.locator(".stamp").bounding_box()
    assert relative is not None and stamp is not None
    assert abs((relative["y"] + relative["height"]) - (stamp["y"] + stamp["height"])) < relative["height"]
    assert stamp["x"] > relative["x"]
