"""Pause, resume and "drain now": persisted, audited, honoured by every drainer (this process's and another kit's)."""

from __future__ import annotations

import re
import time

from exampleapp.models import CreditGrantOutbox, WebhookOutbox
from sqlalchemy import create_engine

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.storage.notify import channel_for
from outboxkit.storage.pauses import PauseCheck, is_paused
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    listening,
    notified,
    row_of,
)
from tests.support.database import sqlalchemy_url
from tests.support.receiver import Reply

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def test_a_paused_outbox_is_not_claimed_by_this_or_another_process_until_resumed(admin, admin_database_url, receiver):
    receiver.respond = lambda request: Reply(status=200)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", attempts=0, error=None, status_code=None,
                             target_url=receiver.url + "/hook")
    paused = admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    other_engine = create_engine(sqlalchemy_url(admin_database_url), pool_size=2)
    other_kit = OutboxKit(other_engine, [CreditGrantOutbox, WebhookOutbox], settings=OutboxKitSettings(), clock=admin.clock)
    try:
        here = admin.kit.drain_once("webhooks")
        there = other_kit.drain_once("webhooks")  # a fresh drainer: its first check reads the table
        assert paused.status_code == 200 and paused.json()["paused"] is True and paused.json()["changed"] is True
        assert (here.claimed, there.claimed) == (0, 0) and row_of(admin.engine, row_id)["attempts"] == 0

        with listening(admin_database_url, WebhookOutbox) as listener:
            resumed = admin.client.post("/admin/api/outboxes/webhooks/resume", json={})
            assert notified(listener) == [channel_for(WebhookOutbox)]  # the drains are woken on commit
        other_kit.drainer("webhooks").pause_check.forget()  # as its NOTIFY wake-up would
        delivered = other_kit.drain_once("webhooks")
    finally:
        other_kit.close()
        other_engine.dispose()
    assert resumed.json() == {**resumed.json(), "action": "resume", "changed": True, "paused": False}
    assert delivered.delivered == 1 and row_of(admin.engine, row_id)["status"] == "done"
    assert [entry["action"] for entry in audit_entries(admin.engine)] == ["pause", "resume"]


def test_pausing_twice_changes_nothing_the_second_time(admin):
    first = admin.client.post("/admin/api/outboxes/webhooks/pause", json={}).json()
    second = admin.client.post("/admin/api/outboxes/webhooks/pause", json={}).json()
    assert (first["changed"], second["changed"]) == (True, False) and second["audit_id"] is None
    assert len(audit_entries(admin.engine)) == 1


def test_the_pause_is_shown_with_the_internal_jobs_the_overview_and_the_outbox_page(admin):
    admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    jobs = {job["id"]: job for job in admin.client.get("/admin/api/schedules/_internal").json()["jobs"]}
    overview = {box["name"]: box for box in admin.client.get("/admin/api/outboxes").json()["outboxes"]}
    page = admin.client.get("/admin/schedules").text
    assert jobs["outboxkit.drain.webhooks"]["paused"] and jobs["outboxkit.drain.webhooks"]["paused_by"] == "admin"
    assert not jobs["outboxkit.drain.credit-grants"]["paused"]
    assert overview["webhooks"]["paused"] and not overview["credit-grants"]["paused"]
    assert page.count(">drains paused</span>") == 1  # read-only there: the controls are on the outbox's page
    rows_page = admin.client.get("/admin/outboxes/webhooks").text
    assert 'id="paused"' in rows_page and 'data-action="resume"' in rows_page


def test_pause_resume_and_drain_now_from_the_pages(admin, receiver):
    receiver.respond = lambda request: Reply(status=200)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", attempts=0, error=None, status_code=None,
                             target_url=receiver.url + "/hook")
    token = TOKEN.search(admin.client.get("/admin/outboxes/webhooks").text).group(1)

    paused = admin.client.post("/admin/outboxes/webhooks/pause", data={"csrf_token": token})
    refused = admin.client.post("/admin/outboxes/webhooks/drain-now", data={"csrf_token": token})
    resumed = admin.client.post("/admin/outboxes/webhooks/resume", data={"csrf_token": token})
    notice = admin.client.get(resumed.headers["location"]).text
    drained = admin.client.post("/admin/outboxes/webhooks/drain-now", data={"csrf_token": token})

    assert paused.status_code == 303 and refused.status_code == 409 and "paused" in refused.text
    assert resumed.headers["location"] == "/admin/outboxes/webhooks" and "Resumed" in notice
    assert drained.status_code == 303
    receiver.wait_for(lambda r: len(r.requests) == 1)  # this process runs no drain loop: drain now drained here
    assert "Woke every drain" in admin.client.get(drained.headers["location"]).text
    assert [entry["action"] for entry in audit_entries(admin.engine)] == ["pause", "resume", "drain_now"]
    deadline = time.monotonic() + 30
    while row_of(admin.engine, row_id)["status"] != "done" and time.monotonic() < deadline:
        time.sleep(0.05)  # the drain-now thread records the outcome after the receiver answered
    assert row_of(admin.engine, row_id)["status"] == "done"


def test_a_control_without_a_json_body_or_for_an_unknown_outbox_is_refused(admin):
    assert admin.client.post("/admin/api/outboxes/webhooks/pause").status_code == 415
    assert admin.client.post("/admin/api/outboxes/webhooks/pause", json={"x": 1}).status_code == 422
    assert admin.client.post("/admin/api/outboxes/nope/pause", json={}).status_code == 404
    with admin.engine.connect() as connection:
        assert not is_paused(connection, "webhooks")


def test_the_pause_check_caches_its_answer_and_forgets_it_on_demand(admin):
    check = PauseCheck(admin.engine, "webhooks", cache_seconds=3600)
    assert check.paused() is False
    admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    assert check.paused() is False  # cached
    check.forget()
    assert check.paused() is True


def test_no_pause_table_means_not_paused(admin_database_url, database_factory, caplog):
    url = database_factory.create_empty()
    engine = create_engine(sqlalchemy_url(url), pool_size=1)
    try:
        assert PauseCheck(engine, "webhooks").paused() is False
        assert "outboxkit_0003" in caplog.text
    finally:
        engine.dispose()
        database_factory.drop(url)


def test_without_a_listener_a_wake_up_drops_the_answer_and_with_one_it_keeps_it(admin):
    check = PauseCheck(admin.engine, "webhooks", cache_seconds=3600, trust_seconds=3600)
    assert check.paused() is False
    admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    check.woken()  # no listener: the wake-up may be a resume (or anything), so the table is read again
    assert check.paused() is True
    admin.client.post("/admin/api/outboxes/webhooks/resume", json={})
    check.follow(True)  # a listener LISTENs now: what was cached before it may be stale, so it is dropped
    assert check.following and check.paused() is False
    admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
    check.woken()  # an insert's wake-up: a pause would have notified, so the answer is kept
    assert check.paused() is False
    check.forget()  # what the pause's notification does
    assert check.paused() is True
    check.follow(False)  # the listener's connection is lost: back to the short cache, and dropped
    assert not check.following and check.paused() is True


def test_a_pause_read_overtaken_by_a_notification_is_not_kept(admin):
    class Overtaken(PauseCheck):
        def _read(self) -> bool:
            answer = super()._read()
            if not overtaken:
                overtaken.append(True)
                admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
                self.forget()  # the pause's notification arrives while the read's answer is on its way
            return answer

    overtaken: list[bool] = []
    check = Overtaken(admin.engine, "webhooks", cache_seconds=3600, trust_seconds=3600)
    check.follow(True)
    assert check.paused() is False  # the answer of the read that started before the pause
    assert check.paused() is True  # not kept: the next claim reads again


def test_a_pause_and_a_resume_notify_the_pause_channel_on_commit(admin, admin_database_url):
    import psycopg
    from psycopg import sql

    from outboxkit.storage.pauses import PAUSES_CHANNEL

    with psycopg.connect(admin_database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(PAUSES_CHANNEL)))
        admin.client.post("/admin/api/outboxes/webhooks/pause", json={})
        admin.client.post("/admin/api/outboxes/webhooks/pause", json={})  # no change: no notification
        admin.client.post("/admin/api/outboxes/webhooks/resume", json={})
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
        assert heard == [(PAUSES_CHANNEL, "webhooks")] * 2
        assert list(listener.notifies(timeout=0.2)) == []
