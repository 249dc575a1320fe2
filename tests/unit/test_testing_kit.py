"""The testing kit itself (outboxkit.testing, outboxkit.pytest_plugin) without a database: the recorder, the plugin's messages.

tests/integration/example_shop/ uses the kit as an application would; the
kit against a real database is in tests/integration/test_testing_kit.py.
"""

from __future__ import annotations

import pytest

from outboxkit import AttemptResult, ConfigurationError, Delivery, FailureKind
from outboxkit.migrations.helpers import KIT_TABLES, include_name, include_object, install_notify_triggers
from outboxkit.storage.tables import kit_metadata
from outboxkit.testing import (
    RecordingTransport,
    UnexpectedSendError,
    connection_error,
    reply,
    timeout,
)
from tests.support.models import SampleEvent

pytest_plugins = ["pytester"]

HOOKS = "https://hooks.example.test/events"
OTHER = "https://other.example.test/events"


def send(recorder: RecordingTransport, url: str = HOOKS, payload: object = None) -> AttemptResult:
    return recorder.send(Delivery(url=url, json=payload or {"n": 1}), idempotency_key="key-1", timeout=5)


@pytest.fixture
def recorder():
    return RecordingTransport()


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


# -- Alembic helpers (tests/integration/test_docs.py runs the whole recipe) ---------------------


def test_the_include_filters_leave_out_exactly_the_kits_tables():
    assert KIT_TABLES == {
        "outboxkit_job_runs",
        "outboxkit_job_fences",
        "outboxkit_reset_audit",
        "outboxkit_attempts",
        "outboxkit_outbox_minutes",
        "outboxkit_outbox_pauses",
        "outboxkit_destinations",
        "outboxkit_ordering_skips",
        "outboxkit_destination_rates",
        "outboxkit_destination_limits",
        "outboxkit_schedules",
        "outboxkit_schedule_leases",
        "outboxkit_schedule_audit",
        "outboxkit_secrets",
        "outboxkit_inbox",
        "outboxkit_inbox_sources",
        "outboxkit_subscriptions",
        "outboxkit_subscription_audit",
        "outboxkit_events",
        "outboxkit_event_types",
        "outboxkit_event_deliveries",
        "outboxkit_wakeups",
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


@pytest.mark.parametrize("prefix", ["Shop", "1shop", "shop-test", "x" * 31, 'a"; DROP DATABASE b'])
def test_a_bad_test_database_prefix_fails_the_test_saying_what_is_allowed(pytester, monkeypatch, prefix):
    monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/never-used")
    monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_PREFIX", prefix)
    pytester.makepyfile("def test_uses_a_database(outboxkit_template): pass")

    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the test database prefix*is not allowed: use 1 to 30 lower-case letters*"])
