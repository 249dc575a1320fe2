"""What operators see of the inbox: the admin's JSON API and ``outboxkit inbox``, from the same figures."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from outboxkit.inbox import InboxConsumer
from tests.support.admin import admin, admin_app, admin_database_url  # noqa: F401  (fixtures)
from tests.support.cli import cli_fixture
from tests.support.worker_app import APP

cli = cli_fixture(["--app", APP])


def traffic(engine) -> None:
    """billing: 2 handled, 1 duplicate, 1 failure; shipping: 1 handled."""
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM outboxkit_inbox"))
        connection.execute(text("DELETE FROM outboxkit_inbox_sources"))
    billing = InboxConsumer(engine, source="billing")
    billing.consume("b-1", lambda session: None)
    billing.consume("b-2", lambda session: None)
    billing.consume("b-1", lambda session: None)

    def refuse(session: object) -> None:
        raise ValueError("negative amount")

    with pytest.raises(ValueError):
        billing.consume("b-3", refuse)
    InboxConsumer(engine, source="shipping").consume("s-1", lambda session: None)


def test_the_api_lists_each_source_with_received_duplicates_and_failures(admin):
    traffic(admin.engine)
    view = admin.client.get("/admin/api/inbox").json()
    billing, shipping = view["sources"]
    figures = ("source", "received", "duplicates", "handler_failures")
    assert tuple(billing[name] for name in figures) == ("billing", 2, 1, 1)
    assert billing["last_error"] == "ValueError: negative amount" and billing["last_received_at"] and billing["last_failure_at"]
    assert tuple(shipping[name] for name in figures) == ("shipping", 1, 0, 0)
    assert shipping["last_duplicate_at"] is None and view["retention_days"] is None


def test_the_api_and_the_page_answer_with_no_source_yet(admin):
    with admin.engine.begin() as connection:
        connection.execute(text("DELETE FROM outboxkit_inbox"))
        connection.execute(text("DELETE FROM outboxkit_inbox_sources"))
    assert admin.client.get("/admin/api/inbox").json()["sources"] == []
    page = admin.client.get("/admin/inbox")
    assert page.status_code == 200 and "No message has been received yet" in page.text


def test_the_cli_shows_the_same_figures_as_a_table_and_as_json(cli, engine):
    traffic(engine)
    code, out, err = cli("inbox")
    assert code == 0, err
    billing_line = next(line for line in out.splitlines() if "billing" in line)
    assert billing_line.split()[:2] == ["billing", "2"] and "negative amount" in billing_line
    code, out, err = cli("--json", "inbox")
    assert code == 0, err
    sources = {source["source"]: source for source in json.loads(out)["sources"]}
    billing, shipping = sources["billing"], sources["shipping"]
    assert (billing["duplicates"], billing["handler_failures"], shipping["received"]) == (1, 1, 1)


def test_the_cli_says_so_when_nothing_was_received(cli):
    code, out, _ = cli("inbox")
    assert code == 0 and "no message has been received yet" in out
