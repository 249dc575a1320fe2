"""Destinations for operators (outboxkit.operations.destinations) against the real database: what is listed, and
resume, disable and probe now, each audited with its actor, an unknown destination refused with nothing changed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from exampleapp.models import WebhookOutbox

from outboxkit.breaker import Signal
from outboxkit.destinations.views import destination_views
from outboxkit.errors import UnknownDestinationError, UnknownOutboxError
from outboxkit.operations.destinations import DestinationOperations
from outboxkit.storage.notify import channel_for
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    listening,
    notified,
    row_of,
    snapshot,
)
from tests.support.destinations import DEAD, destination_row, open_breaker, record


@pytest.fixture
def operations(admin) -> DestinationOperations:
    return DestinationOperations(admin.kit)


def test_an_open_destination_is_listed_with_its_state_failures_last_error_and_rows_waiting(admin, operations):
    record(admin.engine, Signal.SUCCESS, at=START - timedelta(seconds=5), destination="https://partner.example:443")
    state = open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 3, status="pending", next_attempt_at=START)  # its rows: the claim leaves them out
    add_webhooks(admin.engine, 2, status="pending", next_attempt_at=START, target_url="https://partner.example/in")
    view = operations.all()
    webhooks = next(entry for entry in view.outboxes if entry.outbox == "webhooks")
    credit = next(entry for entry in view.outboxes if entry.outbox == "credit-grants")
    dead, partner = webhooks.destinations  # the one that needs a person first
    assert (dead.name, dead.status, dead.consecutive_failures) == (DEAD, "open", 3)
    assert (dead.failure_rate, dead.window_failures, dead.window_successes) == (1.0, 3, 0)
    assert (dead.last_status_code, dead.last_error) == (503, "receiver answered 503")
    assert dead.open_since == START and dead.next_probe_at == START + timedelta(seconds=30)
    assert (dead.waiting_rows, dead.waiting_rows_at_least, dead.waiting_until) == (3, False, state.next_probe_at)
    assert (partner.name, partner.status, partner.waiting_rows, partner.open_since) == (
        "https://partner.example:443", "healthy", 0, None)
    assert partner.failure_rate == 0.0 and webhooks.complete and credit.destinations == []
    assert operations.one("webhooks", DEAD) == dead


def test_rows_waiting_are_a_capped_count(admin):
    state = open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 4, status="pending", next_attempt_at=state.next_probe_at)
    with admin.kit.operator_database.connect() as connection:
        (view,) = destination_views(connection, WebhookOutbox, now=START, cap=3)
    assert (view.waiting_rows, view.waiting_rows_at_least) == (3, True)


def test_resume_makes_an_open_destination_healthy_its_rows_claimable_and_is_audited(admin, admin_database_url, operations):
    open_breaker(admin.engine, at=START)
    held = add_webhooks(admin.engine, 2, status="pending", attempts=3, next_attempt_at=START)
    admin.clock.advance(seconds=5)
    with listening(admin_database_url, WebhookOutbox) as listener:
        result = operations.resume("webhooks", DEAD, actor="alice")
        assert notified(listener) == [channel_for(WebhookOutbox)]  # the drains claim them at once
    assert (result.changed, result.status, result.released_rows) == (True, "healthy", 2)
    assert [(row_of(admin.engine, row_id)["next_attempt_at"], row_of(admin.engine, row_id)["attempts"]) for row_id in held] == [
        (START, 3)] * 2  # untouched: one state UPDATE lets them go
    after = destination_row(admin.engine)
    assert (after["status"], after["consecutive_failures"], after["changed_by"]) == ("healthy", 0, "resumed by alice")
    (entry,) = audit_entries(admin.engine)
    assert (entry["id"], entry["actor"], entry["action"]) == (result.audit_id, "alice", "destination_resume")
    assert entry["filter"] == {"destination": DEAD, "status_before": "open", "status_after": "healthy"}


def test_resume_ends_a_retry_after_slow_down(admin, operations):
    state = record(admin.engine, Signal.THROTTLED, at=START, status_code=429, slow_down=600)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    assert operations.one("webhooks", DEAD).waiting_until == state.slowed_until
    assert operations.one("webhooks", DEAD).waiting_rows == 1
    result = operations.resume("webhooks", DEAD, actor="alice")
    assert (result.changed, result.released_rows) == (True, 1)
    assert destination_row(admin.engine)["slowed_until"] is None and operations.one("webhooks", DEAD).waiting_rows == 0


def test_disable_holds_every_row_until_resumed_and_disabling_again_changes_nothing(admin, operations):
    open_breaker(admin.engine, at=START)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    first = operations.disable("webhooks", DEAD, actor="bob")
    second = operations.disable("webhooks", DEAD, actor="bob")
    disabled = operations.one("webhooks", DEAD)
    assert (first.changed, first.status, second.changed, second.audit_id) == (True, "disabled", False, None)
    assert second.reason == "it is already disabled (disabled by bob)"
    assert disabled.waiting_rows == 1 and disabled.waiting_until is None  # until a person resumes it
    assert disabled.changed_by == "disabled by bob"
    assert [entry["action"] for entry in audit_entries(admin.engine)] == ["destination_disable"]
    assert operations.resume("webhooks", DEAD, actor="bob").released_rows == 1
    assert row_of(admin.engine, row_id)["next_attempt_at"] == START


def test_probe_now_ends_the_cool_down_and_only_an_open_destination_has_one(admin, admin_database_url, operations):
    open_breaker(admin.engine, at=START)
    (row_id,) = add_webhooks(admin.engine, 1, status="pending", next_attempt_at=START)
    admin.clock.advance(seconds=2)
    with listening(admin_database_url, WebhookOutbox) as listener:
        result = operations.probe("webhooks", DEAD, actor="carol")
        assert notified(listener) == [channel_for(WebhookOutbox)]
    now = START + timedelta(seconds=2)
    assert (result.changed, result.status, result.released_rows) == (True, "open", 1)
    assert destination_row(admin.engine)["next_probe_at"] == now and row_of(admin.engine, row_id)["next_attempt_at"] == START
    record(admin.engine, Signal.SUCCESS, at=now)  # the probe went and succeeded: healthy
    again = operations.probe("webhooks", DEAD, actor="carol")
    assert (again.changed, again.reason, again.audit_id) == (False, "it is healthy: there is no cool-down to end", None)
    assert [entry["action"] for entry in audit_entries(admin.engine)] == ["destination_probe"]


def test_resuming_a_healthy_destination_changes_nothing_and_is_not_audited(admin, operations):
    record(admin.engine, Signal.SUCCESS, at=START)
    before = snapshot(admin.engine), destination_row(admin.engine)
    result = operations.resume("webhooks", DEAD, actor="alice")
    assert (result.changed, result.reason) == (False, "it is healthy: nothing holds its rows back")
    assert (snapshot(admin.engine), destination_row(admin.engine)) == before


@pytest.mark.parametrize("action", ["resume", "disable", "probe"])
def test_an_unknown_destination_is_refused_and_nothing_changes(admin, operations, action):
    open_breaker(admin.engine, at=START)
    add_webhooks(admin.engine, 2, status="pending")
    before = snapshot(admin.engine), destination_row(admin.engine)
    with pytest.raises(UnknownDestinationError) as refused:
        getattr(operations, action)("webhooks", "http://127.0.0.1:10", actor="alice")
    assert "has no destination 'http://127.0.0.1:10'" in str(refused.value) and repr(DEAD) in str(refused.value)
    assert "nothing was changed" in str(refused.value)
    with pytest.raises(UnknownDestinationError):
        getattr(operations, action)("webhooks", "", actor="alice")
    with pytest.raises(UnknownOutboxError):
        getattr(operations, action)("no-such-outbox", DEAD, actor="alice")
    assert (snapshot(admin.engine), destination_row(admin.engine)) == before
    assert destination_row(admin.engine, "http://127.0.0.1:10") is None  # no state row was made up for it
