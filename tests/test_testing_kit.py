"""The testing kit itself (outboxkit.testing, outboxkit.pytest_plugin) and the Alembic helpers.

tests/example_shop/ uses the kit as an application would; these tests pin
its rules and its error messages.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import AttemptResult, ConfigurationError, Delivery, FailureKind, ManualClock, OutboxKit, SystemClock
from outboxkit.migrations.helpers import KIT_TABLES, include_name, include_object, install_notify_triggers
from outboxkit.tables import kit_metadata
from outboxkit.testing import (
    NotIdleError,
    OutboxAssertionError,
    RecordingTransport,
    UnexpectedSendError,
    assert_enqueued,
    connection_error,
    drain_until_idle,
    outbox_rows,
    reply,
    timeout,
)
from tests.support.models import SampleEvent

pytest_plugins = ["pytester"]

HOOKS = "https://hooks.example.test/events"
OTHER = "https://other.example.test/events"


def send(recorder: RecordingTransport, url: str = HOOKS, payload: object = None) -> AttemptResult:
    return recorder.send(Delivery(url=url, json=payload or {"n": 1}), idempotency_key="key-1", timeout=5)


def add_events(engine, *payloads: dict, next_attempt_at: datetime | None = None) -> list[int]:
    with Session(engine) as session, session.begin():
        rows = [SampleEvent(target_url=HOOKS, payload=payload) for payload in payloads]
        for row in rows:
            if next_attempt_at is not None:
                row.next_attempt_at = next_attempt_at
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


@pytest.fixture
def recorder():
    return RecordingTransport()


@pytest.fixture
def kit(engine, recorder):
    with OutboxKit(engine, outboxes=[SampleEvent], clock=ManualClock(), transport=recorder) as kit:
        recorder.attach(kit)
        yield kit


# -- RecordingTransport ----------------------------------------------------------


def test_answers_come_from_the_url_queue_then_the_shared_queue_then_the_standing_answer_then_the_default(recorder):
    recorder.queue(503, url=HOOKS)
    recorder.queue(429)
    recorder.always(reply(500, body="down"), url=HOOKS)

    assert send(recorder).status_code == 503  # queued for this URL
    assert send(recorder).status_code == 429  # queued for any URL
    assert send(recorder).error == "HTTP 500: down"  # the standing answer, from now on
    assert send(recorder).status_code == 500
    assert send(recorder, OTHER).status_code == 200  # the default
    assert [(each.url, each.result.status_code) for each in recorder.sends] == [
        (HOOKS, 503),
        (HOOKS, 429),
        (HOOKS, 500),
        (HOOKS, 500),
        (OTHER, 200),
    ]


def test_a_send_is_recorded_as_it_would_go_on_the_wire(recorder):
    recorder.send(Delivery(url=HOOKS, method="put", json={"at": 1.5}, headers={"X-Kind": "a"}), idempotency_key="k-9", timeout=3)

    [recorded] = recorder.sends
    assert (recorded.method, recorded.url, recorded.timeout) == ("PUT", HOOKS, 3)
    assert recorded.headers == {"X-Kind": "a", "Idempotency-Key": "k-9"}
    assert recorded.body == b'{"at":1.5}' and recorded.json == {"at": 1.5}
    assert recorded.outbox is None  # not attached to a kit


def test_scripted_failures_are_the_attempt_results_the_http_transport_reports(recorder):
    recorder.queue(timeout(), connection_error(), reply(429, retry_after=120), lambda sent: 201 if sent.json["n"] else 500)

    results = [send(recorder) for _ in range(4)]

    assert [result.failure for result in results[:2]] == [FailureKind.TIMEOUT, FailureKind.CONNECTION]
    assert (results[2].status_code, results[2].retry_after) == (429, "120")
    assert results[3] == AttemptResult(status_code=201)


@pytest.mark.parametrize("answer", ["ok", None, 2.5, True])
def test_a_bad_answer_is_refused_when_it_is_scripted(recorder, answer):
    with pytest.raises(TypeError, match="status code or an AttemptResult"):
        recorder.queue(answer)
    assert send(recorder).status_code == 200  # nothing was queued


def test_a_status_outside_http_is_refused():
    with pytest.raises(ValueError, match="100 to 599"):
        reply(700)


def test_a_strict_recorder_fails_a_send_it_has_no_answer_for_and_reports_it_once():
    recorder = RecordingTransport(strict=True)
    recorder.always(201, url=HOOKS)

    assert send(recorder).status_code == 201
    result = send(recorder, OTHER)

    assert result.failure is FailureKind.CONNECTION and "no answer scripted" in result.error
    with pytest.raises(UnexpectedSendError, match=r"1 unexpected send\(s\):\n  POST https://other\.example\.test/events"):
        recorder.check()
    recorder.check()  # reported once


def test_an_answer_function_that_raises_is_an_unexpected_send(recorder):
    recorder.queue(lambda sent: sent.json["missing"])

    assert send(recorder).failure is FailureKind.CONNECTION
    with pytest.raises(UnexpectedSendError, match="KeyError"):
        recorder.check()


def test_sends_for_an_outbox_needs_the_recorder_attached(recorder):
    send(recorder)

    with pytest.raises(ConfigurationError, match=r"recorder\.attach\(kit\)"):
        recorder.sends_for(SampleEvent)


# -- drain_until_idle ------------------------------------------------------------


def test_drain_until_idle_runs_a_row_through_the_backoff_table(engine, kit, recorder):
    [row_id] = add_events(engine, {"n": 1})
    recorder.queue(503, 503, timeout(), 200)

    report = drain_until_idle(kit)

    assert (report.delivered, report.retried, report.stuck) == (1, 3, 0)
    assert report.rounds == 4 and report.pending == 0
    assert report.advanced >= timedelta(seconds=1 + 2 + 4)  # SampleEvent's backoff table
    assert [send.outbox for send in recorder.sends] == ["sample-events"] * 4
    [row] = outbox_rows(engine, SampleEvent)
    assert (row.id, row.status, row.attempts) == (row_id, "done", 4)


def test_drain_until_idle_refuses_to_move_a_clock_that_is_not_manual(engine, recorder):
    add_events(engine, {"n": 1})
    with OutboxKit(engine, outboxes=[SampleEvent], clock=SystemClock(), transport=recorder) as kit:
        with pytest.raises(ConfigurationError, match=r"only move time on a ManualClock.*advance_clock=False"):
            drain_until_idle(kit)

    assert recorder.sends == []
    [row] = outbox_rows(engine, SampleEvent)
    assert (row.status, row.attempts) == ("pending", 0)


def test_drain_until_idle_refuses_a_clock_that_is_not_the_kits(kit):
    with pytest.raises(ConfigurationError, match="must be the kit's own clock"):
        drain_until_idle(kit, clock=ManualClock())


def test_without_advancing_the_clock_a_row_in_backoff_stays_pending(engine, recorder):
    add_events(engine, {"n": 1})
    recorder.queue(503)
    with OutboxKit(engine, outboxes=[SampleEvent], clock=SystemClock(), transport=recorder) as kit:
        report = drain_until_idle(kit, advance_clock=False)

    assert (report.rounds, report.retried, report.pending) == (1, 1, 1)
    assert len(recorder.sends) == 1


def test_a_row_scheduled_for_tomorrow_waits_until_the_clock_gets_there(engine, kit, recorder):
    add_events(engine, {"n": 1}, next_attempt_at=datetime.now(timezone.utc) + timedelta(days=1))

    assert drain_until_idle(kit, advance_clock=False).pending == 1
    assert recorder.sends == []
    report = drain_until_idle(kit)

    assert report.delivered == 1 and report.advanced >= timedelta(hours=23)


def test_a_manual_clock_behind_the_wall_clock_is_brought_up_to_it(engine, recorder):
    clock = ManualClock(datetime(2020, 1, 1, tzinfo=timezone.utc))
    add_events(engine, {"n": 1})
    with OutboxKit(engine, outboxes=[SampleEvent], clock=clock, transport=recorder) as kit:
        report = drain_until_idle(kit, clock=clock)

    assert report.delivered == 1 and report.rounds == 1
    assert report.started_at.year >= 2026


def test_a_row_that_stays_due_is_reported_as_not_idle(engine, kit):
    add_events(engine, {"n": 1})
    with engine.connect() as holder, holder.begin():  # a transaction the test forgot: it locks the row
        holder.execute(text("SELECT id FROM sample_event_outbox FOR UPDATE"))
        with pytest.raises(NotIdleError, match=r"still not idle after 3 rounds.*1 row\(s\) pending.*locked"):
            drain_until_idle(kit, max_rounds=3)


def test_a_failing_drain_is_reported_as_not_idle(engine, kit):
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE sample_event_outbox"))

    with pytest.raises(NotIdleError, match=r"the drain of 'sample-events' failed in round 1: .*sample_event_outbox"):
        drain_until_idle(kit)


def test_drain_until_idle_raises_for_an_unexpected_send_after_recording_every_outcome(engine):
    recorder = RecordingTransport(strict=True)
    add_events(engine, {"n": 1}, {"n": 2})
    with OutboxKit(engine, outboxes=[SampleEvent], clock=ManualClock(), transport=recorder) as kit:
        recorder.attach(kit)
        with pytest.raises(UnexpectedSendError, match=r"2 unexpected send\(s\)"):
            drain_until_idle(kit)

    assert [(row.status, row.attempts) for row in outbox_rows(engine, SampleEvent)] == [("pending", 1)] * 2


# -- respx -------------------------------------------------------------------------


def test_respx_sees_the_sends_of_the_kits_own_http_transport(engine, respx_mock):
    """The kit's default HttpTransport (its direct, pooled path) is what respx must intercept."""
    route = respx_mock.post(HOOKS).respond(204)
    [row_id] = add_events(engine, {"n": 1})
    with OutboxKit(engine, outboxes=[SampleEvent], clock=ManualClock()) as kit:
        report = drain_until_idle(kit)

    assert report.delivered == 1 and route.call_count == 1
    [row] = outbox_rows(engine, SampleEvent)
    assert (row.id, row.status) == (row_id, "done")
    assert route.calls.last.request.headers["Idempotency-Key"] == str(row.idempotency_key)


# -- assert_enqueued ---------------------------------------------------------------


def test_assert_enqueued_returns_the_matching_rows(engine):
    add_events(engine, {"n": 1}, {"n": 2})

    [row] = assert_enqueued(engine, SampleEvent, where=lambda row: row.payload["n"] == 2)
    assert row.payload == {"n": 2}
    assert len(assert_enqueued(engine, SampleEvent, count=2, where={"target_url": HOOKS}, status="pending")) == 2


def test_a_failed_assert_enqueued_shows_what_the_table_holds(engine):
    ids = add_events(engine, {"n": 1}, {"n": 2})

    with pytest.raises(OutboxAssertionError) as failure:
        assert_enqueued(engine, SampleEvent, where={"kind": "refund"})

    message = str(failure.value)
    assert message.startswith("expected 1 row(s) in sample_event_outbox matching {'kind': 'refund'}, found 0;")
    assert "sample_event_outbox holds 2 row(s):" in message
    assert f"id={ids[0]} status='pending' attempts=0" in message and "payload={'n': 2}" in message
    assert isinstance(failure.value, AssertionError)


def test_a_failed_assert_enqueued_on_an_empty_table_says_so(engine):
    with pytest.raises(OutboxAssertionError, match=r"found 0; sample_event_outbox is empty"):
        assert_enqueued(engine, SampleEvent)


def test_assert_enqueued_refuses_a_name_that_is_not_a_column(engine):
    columns = "target_url, kind, payload, id, "
    with pytest.raises(ConfigurationError, match=rf"names \['amount'\], not columns of SampleEvent; its columns: {columns}"):
        assert_enqueued(engine, SampleEvent, where={"amount": 5})


# -- the pytest plugin ---------------------------------------------------------------

PLUGIN = ("-p", "outboxkit.pytest_plugin")


def test_the_plugin_does_nothing_in_a_suite_that_does_not_use_it(pytester, monkeypatch):
    monkeypatch.delenv("OUTBOXKIT_TEST_DATABASE_URL", raising=False)
    pytester.makepyfile("def test_plain(): assert True")

    pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_kit_fixture_without_models_says_how_to_configure_them(pytester, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/never-used")
    pytester.makepyfile("def test_uses_the_kit(outboxkit_kit): pass")

    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*outboxkit's fixtures need your models*", "*def outboxkit_metadata():*"])


def test_the_kit_fixture_without_a_server_names_the_variable(pytester, monkeypatch):
    monkeypatch.delenv("OUTBOXKIT_TEST_DATABASE_URL", raising=False)
    pytester.makeconftest(
        "import pytest\n"
        "from tests.support.models import SampleBase\n"
        "@pytest.fixture(scope='session')\n"
        "def outboxkit_metadata():\n"
        "    return SampleBase.metadata\n"
    )
    pytester.makepyfile("def test_uses_the_kit(outboxkit_kit): pass")

    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*set OUTBOXKIT_TEST_DATABASE_URL=postgresql://*outboxkit_server_url*"])


# -- Alembic helpers (tests/test_docs.py runs the whole recipe) ---------------------


def test_the_include_filters_leave_out_exactly_the_kits_tables():
    assert KIT_TABLES == {
        "outboxkit_job_runs",
        "outboxkit_reset_audit",
        "outboxkit_attempts",
        "outboxkit_outbox_minutes",
        "outboxkit_outbox_pauses",
        "outboxkit_schedules",
        "outboxkit_schedule_leases",
        "outboxkit_schedule_audit",
    }
    assert not include_name("outboxkit_job_runs", "table", {"schema_name": None})
    assert include_name("sample_event_outbox", "table", {"schema_name": None})
    assert include_name("public", "schema", {})
    audit = kit_metadata.tables["outboxkit_reset_audit"]
    assert not include_object(audit, audit.name, "table", False, None)
    assert not include_object(next(iter(audit.indexes)), "ix_outboxkit_reset_audit_at", "index", False, None)
    assert include_object(SampleEvent.__table__, "sample_event_outbox", "table", False, None)


def test_install_notify_triggers_refuses_what_is_not_an_outbox():
    with pytest.raises(ConfigurationError, match="at least one outbox"):
        install_notify_triggers()
    with pytest.raises(ConfigurationError, match="is not a mapped Outbox subclass"):
        install_notify_triggers(SampleEvent, "sample_event_outbox")  # type: ignore[arg-type]
