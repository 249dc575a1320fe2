"""A schedule's HTTP target passes the URL guard at save time (a clear refusal, nothing written) and again at send
time (the row is stuck with the reason), and a refusal never sends anything.

Receivers listen on 127.0.0.1 only: a kit with ``url_allow_list=("127.0.0.1/32",)`` delivers to them; without it
the same URLs are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from outboxkit import InvalidScheduleError, ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.schedules.definitions import HttpTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.store import ScheduleStore
from outboxkit.storage.tables import schedule_audit, schedules
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.models import SampleEvent, ScheduledCall
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

EVERY_MINUTE = ScheduleTrigger.every(minutes=1)
LOOPBACK_ALLOWED = OutboxKitSettings(listen_enabled=False, url_allow_list=("127.0.0.1/32",))


def counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return (
            connection.scalar(select(func.count()).select_from(schedules)) or 0,
            connection.scalar(select(func.count()).select_from(schedule_audit)) or 0,
        )


def http_schedule(url: str) -> ScheduleDefinition:
    return ScheduleDefinition(name="partner.ping", trigger=EVERY_MINUTE, target=HttpTarget(url=url, outbox="scheduled-calls"))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:5432/", "127.0.0.1 is a loopback address"),
        ("http://2130706433:8000/", "2130706433 resolves to 127.0.0.1, which is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.5/hook", "private"),
    ],
)
def test_saving_a_target_to_a_non_public_address_is_refused_and_writes_nothing(engine, clock, url, reason):
    store = ScheduleStore(engine, clock=clock, outboxes=[ScheduledCall])
    with pytest.raises(InvalidScheduleError, match=f"^target.url: .*{reason}.*OUTBOXKIT_URL_ALLOW_LIST") as refused:
        store.create(http_schedule(url), actor="mallory")
    assert refused.value.field == "target.url"
    assert counts(engine) == (0, 0)


def test_the_kits_store_takes_the_allow_list_from_the_settings(engine, clock):
    with OutboxKit(engine, [SampleEvent, ScheduledCall], clock=clock, settings=LOOPBACK_ALLOWED) as kit:
        kit.schedules.store.create(http_schedule("http://127.0.0.1:9/ping"), actor="alice")
    assert counts(engine) == (1, 1)


def enqueue_call(engine: Engine, url: str) -> None:
    """A schedule's request as the runner enqueues it (saved while the address was allowed)."""
    with Session(engine) as session, session.begin():
        session.add(ScheduledCall(schedule_name="partner.ping", scheduled_for=datetime(2030, 1, 1, tzinfo=timezone.utc),
                                  method="POST", url=url, headers={}, body={"n": 1}))


def call_row(engine: Engine) -> ScheduledCall:
    with Session(engine) as session:
        return session.scalars(select(ScheduledCall)).one()


def test_at_send_time_a_refused_url_leaves_the_row_stuck_with_the_reason_and_sends_nothing(engine, clock, receiver):
    enqueue_call(engine, receiver.url + "/ping")
    with OutboxKit(engine, [SampleEvent, ScheduledCall], clock=clock, settings=OutboxKitSettings(listen_enabled=False)) as kit:
        result = kit.drain_once(ScheduledCall)
    assert (result.claimed, result.delivered) == (1, 0)
    assert (receiver.connections, receiver.requests) == (0, [])
    row = call_row(engine)
    assert (row.status, row.attempts) == ("stuck", 1)
    assert row.last_error.startswith("refused before sending: ") and "127.0.0.1 is a loopback address" in row.last_error


def test_at_send_time_an_allowed_url_is_delivered_and_an_error_body_is_not_kept(engine, clock, receiver):
    from tests.support.receiver import Reply

    enqueue_call(engine, receiver.url + "/ping")
    receiver.respond = lambda request: Reply(status=503, body=b"internal: connection to db-primary:5432 refused")
    with OutboxKit(engine, [SampleEvent, ScheduledCall], clock=clock, settings=LOOPBACK_ALLOWED) as kit:
        kit.drain_once(ScheduledCall)
        assert (call_row(engine).status, call_row(engine).last_error) == ("pending", "HTTP 503")
        receiver.respond = lambda request: Reply()
        clock.advance(seconds=5)
        assert kit.drain_once(ScheduledCall).delivered == 1
    assert [request.path for request in receiver.requests] == ["/ping", "/ping"]


@pytest.fixture(scope="module")
def strict_admin(admin_database_url) -> Iterator[ScheduleAdminApp]:
    with schedule_admin_app(admin_database_url, clock=ManualClock(datetime(2026, 3, 27, 12, tzinfo=timezone.utc)),
                            settings=OutboxKitSettings(listen_enabled=False)) as app:
        yield app


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/ping", "http://[::1]:5432/", "http://0x7f.1/"])
def test_the_admin_api_answers_422_naming_the_url_and_changes_nothing(strict_admin: ScheduleAdminApp, url):
    strict_admin.clear()
    body = {"name": "partner.ping", "trigger": {"kind": "every", "fields": {"minutes": 5}},
            "target": {"kind": "http", "url": url, "outbox": "scheduled-calls"}}
    answer = strict_admin.client.post("/admin/api/schedules/new", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "target", "url"]
    assert "loopback address" in answer.json()["detail"][0]["msg"]
    with strict_admin.engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM outboxkit_schedules")) == 0


def test_a_drainer_built_without_the_kit_guards_a_schedules_requests_too(engine, clock, receiver):
    from outboxkit.drain.drainer import drain_once

    enqueue_call(engine, receiver.url + "/ping")
    assert drain_once(engine, ScheduledCall, clock=clock).delivered == 0
    assert receiver.requests == []
    assert call_row(engine).status == "stuck" and "loopback" in call_row(engine).last_error
