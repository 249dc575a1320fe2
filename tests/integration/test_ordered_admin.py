"""The operator's side of ordered delivery: what a stuck head blocks, and the skip (API, pages, CLI).

The admin and the CLI reach the rows through ``outboxkit.operations.ordered_keys``; a skip leaves the row
``stuck`` (never deleted), is audited as ``skip`` and wakes the drain; the rows of its key behind it flow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from outboxkit.cli import main
from outboxkit.storage.notify import channel_for
from tests.support.admin import (  # noqa: F401  (fixtures)
    AdminHarness,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    listening,
    notified,
)
from tests.support.database import sqlalchemy_url
from tests.support.models import OrderedEvent
from tests.support.ordered_admin import add_ordered, ordered_admin_harness, ordered_status

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def ordered_admin(database_url) -> Iterator[AdminHarness]:
    with ordered_admin_harness(database_url) as harness:
        yield harness


def skips(engine) -> list[int]:
    with engine.connect() as connection:
        return list(connection.scalars(text("SELECT row_id FROM outboxkit_ordering_skips ORDER BY row_id")))


def test_the_api_lists_each_stuck_head_with_the_rows_waiting_behind_it(ordered_admin, receiver):
    url = receiver.url + "/ordered"
    (head_a,) = add_ordered(ordered_admin.engine, [("a", 0)], target_url=url, status="stuck")
    add_ordered(ordered_admin.engine, [("a", 1), ("a", 2), ("b", 0)], target_url=url)
    (head_c,) = add_ordered(ordered_admin.engine, [("c", 0)], target_url=url, status="stuck")
    add_ordered(ordered_admin.engine, [(None, 0)], target_url=url, status="stuck")  # unordered: blocks nothing

    listed = ordered_admin.client.get("/admin/api/outboxes/ordered-events/blocked-keys")
    detail = ordered_admin.client.get(f"/admin/api/outboxes/ordered-events/rows/{head_a}").json()

    assert listed.status_code == 200
    body = listed.json()
    assert body["ordering_key"] == "stream" and body["more"] is False
    assert [(key["id"], key["key"], key["waiting"]) for key in body["keys"]] == [(head_a, "a", 2), (head_c, "c", 0)]
    assert detail["ordering"] == {
        "key": "a", "head": True, "head_id": head_a, "waiting": 2, "waiting_cap": 10_000, "skipped": False,
    }


def test_skip_releases_the_key_keeps_the_row_stuck_is_audited_and_wakes_the_drain(
    ordered_admin, database_url, receiver
):
    url = receiver.url + "/ordered"
    (head,) = add_ordered(ordered_admin.engine, [("a", 0)], target_url=url, status="stuck")
    behind = add_ordered(ordered_admin.engine, [("a", 1), ("a", 2)], target_url=url)
    assert ordered_admin.kit.drain_once("ordered-events").claimed == 0  # blocked by its stuck head

    with listening(database_url, OrderedEvent) as listener:
        skipped = ordered_admin.client.post("/admin/api/outboxes/ordered-events/skip", json={"ids": [head]})
        assert notified(listener) == [channel_for(OrderedEvent)]
    again = ordered_admin.client.post("/admin/api/outboxes/ordered-events/skip", json={"ids": [head]})
    drained = ordered_admin.kit.drain("ordered-events")

    assert skipped.status_code == 200
    assert skipped.json() == {**skipped.json(), "action": "skip", "changed": 1, "changed_ids": [head]}
    assert again.json()["changed"] == 0 and again.json()["skipped"] == [{"id": head, "reason": "already skipped"}]
    assert drained.delivered == 2
    assert ordered_status(ordered_admin.engine) == {head: "stuck", behind[0]: "done", behind[1]: "done"}
    assert skips(ordered_admin.engine) == [head]
    assert [(entry["action"], entry["row_ids"]) for entry in audit_entries(ordered_admin.engine)] == [("skip", [head])]
    assert ordered_admin.client.get("/admin/api/outboxes/ordered-events/blocked-keys").json()["keys"] == []


def test_skip_leaves_rows_that_block_nothing_alone_and_refuses_unknown_ids(ordered_admin, receiver):
    url = receiver.url + "/ordered"
    (pending,) = add_ordered(ordered_admin.engine, [("a", 0)], target_url=url)
    (unkeyed,) = add_ordered(ordered_admin.engine, [(None, 0)], target_url=url, status="stuck")

    left = ordered_admin.client.post("/admin/api/outboxes/ordered-events/skip", json={"ids": [pending, unkeyed]})
    unknown = ordered_admin.client.post("/admin/api/outboxes/ordered-events/skip", json={"ids": [pending, 999_999]})

    assert left.status_code == 200 and left.json()["changed"] == 0
    assert [entry["id"] for entry in left.json()["skipped"]] == [pending, unkeyed]
    assert "only a stuck row is skipped" in left.json()["skipped"][0]["reason"]
    assert "NULL" in left.json()["skipped"][1]["reason"]
    assert unknown.status_code == 404 and "999999" in unknown.json()["detail"]
    assert skips(ordered_admin.engine) == [] and audit_entries(ordered_admin.engine) == []


def test_skip_and_blocked_keys_refuse_an_unordered_outbox(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    skipped = admin.client.post("/admin/api/outboxes/webhooks/skip", json={"ids": [row_id]})
    listed = admin.client.get("/admin/api/outboxes/webhooks/blocked-keys")
    assert skipped.status_code == 422 and "has no ordering key" in skipped.json()["detail"][0]["msg"]
    assert skipped.json()["detail"][0]["loc"] == ["path", "outbox"]
    assert listed.status_code == 422
    assert admin.client.get(f"/admin/api/outboxes/webhooks/rows/{row_id}").json()["ordering"] is None


def test_the_row_page_skips_with_a_csrf_protected_post(ordered_admin, receiver):
    url = receiver.url + "/ordered"
    (head,) = add_ordered(ordered_admin.engine, [("a", 0)], target_url=url, status="stuck")
    add_ordered(ordered_admin.engine, [("a", 1)], target_url=url)
    page = ordered_admin.client.get(f"/admin/outboxes/ordered-events/rows/{head}")
    assert "head of its key" in page.text and "Skip it in its key" in page.text

    forged = ordered_admin.client.post(f"/admin/outboxes/ordered-events/rows/{head}/skip", data={"csrf_token": "x"})
    assert forged.status_code == 403 and skips(ordered_admin.engine) == []

    token = TOKEN.search(page.text).group(1)
    done = ordered_admin.client.post(f"/admin/outboxes/ordered-events/rows/{head}/skip", data={"csrf_token": token})
    assert done.status_code == 303 and skips(ordered_admin.engine) == [head]


def test_the_cli_lists_blocked_keys_and_skips(database_url, engine, monkeypatch, capsys, receiver):
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))
    app = ["--app", "tests.support.ordered_admin:ordered_kit_from_environment"]
    (head,) = add_ordered(engine, [("a", 0)], target_url=receiver.url + "/ordered", status="stuck")
    add_ordered(engine, [("a", 1), ("a", 2)], target_url=receiver.url + "/ordered")

    listed = main([*app, "--json", "blocked", "ordered-events"])
    listing = json.loads(capsys.readouterr().out)
    skipped = main([*app, "--json", "skip", "ordered-events", str(head)])
    result = json.loads(capsys.readouterr().out)
    refused = main(["--app", "exampleapp.app:kit_from_environment", "skip", "webhooks", "1"])
    refusal = capsys.readouterr().err

    assert listed == 0 and [(key["id"], key["waiting"]) for key in listing["keys"]] == [(head, 2)]
    assert skipped == 0 and result["changed_ids"] == [head]
    assert skips(engine) == [head] and audit_entries(engine)[0]["actor"].startswith("cli:")
    assert refused == 1 and "has no ordering key" in refusal


def test_a_discarded_head_frees_its_key_and_a_reset_puts_it_back_in_order(ordered_admin, receiver):
    url = receiver.url + "/ordered"
    (head,) = add_ordered(ordered_admin.engine, [("a", 0)], target_url=url, status="stuck")
    behind = add_ordered(ordered_admin.engine, [("a", 1)], target_url=url)
    assert ordered_admin.kit.drain_once("ordered-events").claimed == 0  # blocked by its stuck head

    discarded = ordered_admin.client.post("/admin/api/outboxes/ordered-events/discard", json={"ids": [head]}).json()

    assert discarded["changed_ids"] == [head]
    assert ordered_admin.client.get("/admin/api/outboxes/ordered-events/blocked-keys").json()["keys"] == []
    assert ordered_admin.kit.drain("ordered-events").delivered == 1
    assert ordered_status(ordered_admin.engine) == {head: "discarded", behind[0]: "done"}
    ordered_admin.client.post("/admin/api/outboxes/ordered-events/reset", json={"ids": [head]})
    assert ordered_admin.kit.drain("ordered-events").delivered == 1
    assert ordered_status(ordered_admin.engine)[head] == "done"
