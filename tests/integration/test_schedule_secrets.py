"""Credentials of HTTP targets: referenced from the settings by name, never stored or shown in clear.

A header value ``secret:NAME`` is replaced at send time by the setting
``OUTBOXKIT_SECRETS__NAME``; a literal ``Authorization``, ``Proxy-Authorization``
or ``Cookie`` and a URL with user information are refused when saved, with a
message saying how to reference a secret; a row stored before these rules is
shown with its credentials redacted on every page, in the API, the audit, and in
its fired rows' detail and export.  Receivers listen on 127.0.0.1 (allow-listed).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from outboxkit import InvalidScheduleError, ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.schedules.definitions import HttpTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.storage.tables import schedule_audit, schedules
from tests.support.admin import admin_database_url  # noqa: F401  (fixture)
from tests.support.models import SampleEvent, ScheduledCall
from tests.support.schedule_admin import ScheduleAdminApp, schedule_admin_app

TOKEN = "Bearer s3cr3t-t0ken-value"
SETTINGS = OutboxKitSettings(
    listen_enabled=False, url_allow_list=("127.0.0.1/32",), secrets={"partner_token": SecretStr(TOKEN)}
)
EVERY_MINUTE = ScheduleTrigger.every(minutes=1)


def definition(url: str, headers: dict[str, str]) -> ScheduleDefinition:
    target = HttpTarget(url=url, outbox="scheduled-calls", headers=headers, body={"n": 1})
    return ScheduleDefinition(name="partner.ping", trigger=EVERY_MINUTE, target=target)


def written(engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return (connection.scalar(select(func.count()).select_from(schedules)) or 0,
                connection.scalar(select(func.count()).select_from(schedule_audit)) or 0)


@pytest.fixture
def kit(engine, clock) -> Iterator[OutboxKit]:
    with OutboxKit(engine, [SampleEvent, ScheduledCall], clock=clock, settings=SETTINGS) as kit:
        yield kit


@pytest.mark.parametrize(
    ("url", "headers", "field"),
    [
        ("http://127.0.0.1:9/ping", {"Authorization": TOKEN}, "target.headers"),
        ("http://127.0.0.1:9/ping", {"cookie": "session=s3cr3t-t0ken-value"}, "target.headers"),
        ("http://partner:s3cr3t-t0ken-value@127.0.0.1:9/ping", {}, "target.url"),
    ],
)
def test_a_literal_credential_is_refused_with_how_to_reference_a_secret(kit, engine, url, headers, field):
    with pytest.raises(InvalidScheduleError) as refused:
        kit.schedules.store.create(definition(url, headers), actor="alice")
    assert refused.value.field == field
    assert "OUTBOXKIT_SECRETS__" in str(refused.value) and "secret:" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
    assert written(engine) == (0, 0)


def test_a_reference_to_a_secret_the_settings_lack_is_refused_naming_the_variable(kit, engine):
    with pytest.raises(InvalidScheduleError, match="^target.headers: .*OUTBOXKIT_SECRETS__MISSING_TOKEN"):
        kit.schedules.store.create(definition("http://127.0.0.1:9/ping", {"Authorization": "secret:missing_token"}),
                                   actor="alice")
    assert written(engine) == (0, 0)


def test_a_referenced_secret_is_sent_and_only_its_name_is_stored(kit, engine, receiver):
    kit.schedules.store.create(definition(receiver.url + "/ping", {"Authorization": "secret:partner_token"}), actor="alice")
    enqueue(engine, receiver.url + "/ping", {"Authorization": "secret:partner_token"})
    assert kit.drain_once(ScheduledCall).delivered == 1
    [request] = receiver.requests
    assert request.headers["Authorization"] == TOKEN
    with engine.connect() as connection:
        stored = [str(row) for row in connection.execute(text("SELECT * FROM outboxkit_schedules"))]
        stored += [str(row) for row in connection.execute(text("SELECT * FROM outboxkit_schedule_audit"))]
        stored += [str(row) for row in connection.execute(text("SELECT * FROM scheduled_call_outbox"))]
    assert not [row for row in stored if "s3cr3t" in row]


def test_at_send_time_a_secret_the_settings_lack_leaves_the_row_stuck_and_sends_nothing(kit, engine, receiver):
    enqueue(engine, receiver.url + "/ping", {"Authorization": "secret:rotated_away"})
    kit.drain_once(ScheduledCall)
    assert receiver.requests == []
    with Session(engine) as session:
        row = session.scalars(select(ScheduledCall)).one()
    assert row.status == "stuck"
    assert row.last_error.startswith("refused before sending: ") and "OUTBOXKIT_SECRETS__ROTATED_AWAY" in row.last_error


def enqueue(engine, url: str, headers: dict[str, str]) -> None:
    with Session(engine) as session, session.begin():
        session.add(ScheduledCall(schedule_name="partner.ping", scheduled_for=datetime(2030, 1, 1, tzinfo=timezone.utc),
                                  method="POST", url=url, headers=headers, body={"n": 1}))


# -- rows stored before the rules: shown redacted ---------------------------------------------------------------


@pytest.fixture(scope="module")
def module_admin(admin_database_url) -> Iterator[ScheduleAdminApp]:
    with schedule_admin_app(admin_database_url, clock=ManualClock(datetime(2026, 3, 27, 12, tzinfo=timezone.utc)),
                            settings=SETTINGS) as app:
        yield app


def test_credentials_stored_before_the_rules_are_redacted_wherever_they_are_shown(module_admin: ScheduleAdminApp):
    api = module_admin
    api.clear()
    created = api.client.post("/admin/api/schedules/new", json={
        "name": "legacy.ping", "trigger": {"kind": "every", "fields": {"minutes": 5}},
        "target": {"kind": "http", "url": "http://127.0.0.1:9/ping", "outbox": "scheduled-calls",
                   "headers": {"X-Source": "shop"}},
    })
    assert created.status_code == 200, created.text
    legacy_url = "http://partner:s3cr3t-t0ken-value@127.0.0.1:9/ping"
    legacy_headers = '{"Authorization": "Bearer s3cr3t-t0ken-value", "X-Api-Key": "s3cr3t-t0ken-value", "X-Source": "shop"}'
    with api.engine.begin() as connection:  # as written before these rules existed
        connection.execute(text("UPDATE outboxkit_schedules SET http_url = :url, http_headers = CAST(:headers AS jsonb)"),
                           {"url": legacy_url, "headers": legacy_headers})
        connection.execute(text("UPDATE outboxkit_schedule_audit SET after = jsonb_set(jsonb_set(after, '{http_url}', "
                                "to_jsonb(CAST(:url AS text))), '{http_headers}', CAST(:headers AS jsonb))"),
                           {"url": legacy_url, "headers": legacy_headers})
        connection.execute(text("DELETE FROM scheduled_call_outbox"))
        connection.execute(text(
            "INSERT INTO scheduled_call_outbox (idempotency_key, status, attempts, next_attempt_at, created_at, updated_at, "
            "schedule_name, scheduled_for, method, url, headers, body) VALUES (gen_random_uuid(), 'stuck', 1, now(), now(), "
            "now(), 'legacy.ping', now(), 'POST', :url, CAST(:headers AS jsonb), '{}')"
        ), {"url": legacy_url, "headers": legacy_headers})
        row_id = connection.scalar(text("SELECT id FROM scheduled_call_outbox"))
    shown = {
        "list": api.client.get("/admin/api/schedules").text,
        "detail": api.client.get("/admin/api/schedules/legacy.ping").text,
        "audit": api.client.get("/admin/api/schedules/legacy.ping/audit").text,
        "list page": api.client.get("/admin/schedules").text,
        "detail page": api.client.get("/admin/schedules/legacy.ping").text,
        "edit form": api.client.get("/admin/schedules/legacy.ping/edit").text,
        "fired row": api.client.get(f"/admin/api/outboxes/scheduled-calls/rows/{row_id}").text,
        "fired row page": api.client.get(f"/admin/outboxes/scheduled-calls/rows/{row_id}").text,
        "export csv": api.client.get("/admin/api/outboxes/scheduled-calls/export", params={"format": "csv"}).text,
        "export ndjson": api.client.get("/admin/api/outboxes/scheduled-calls/export", params={"format": "ndjson"}).text,
    }
    assert {where: "s3cr3t" in answer for where, answer in shown.items()} == {where: False for where in shown}
    assert "X-Source" in shown["detail"] and "shop" in shown["fired row"]
