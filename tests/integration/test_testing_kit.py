"""The testing kit itself (outboxkit.testing, outboxkit.pytest_plugin) and the Alembic helpers.

tests/integration/example_shop/ uses the kit as an application would; these tests pin
its rules and its error messages.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import ConfigurationError, ManualClock, OutboxKit, SystemClock
from outboxkit.errors import InvalidTypeError
from outboxkit.testing import (
    NotIdleError,
    OutboxAssertionError,
    RecordingTransport,
    UnexpectedSendError,
    assert_enqueued,
    drain_until_idle,
    outbox_rows,
    timeout,
)
from tests.support.models import SampleEvent
from tests.unit.test_testing_kit import HOOKS, recorder, send  # noqa: F401  (recorder: fixture)

pytest_plugins = ["pytester"]


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
def kit(engine, recorder):
    with OutboxKit(engine, outboxes=[SampleEvent], clock=ManualClock(), transport=recorder) as kit:
        recorder.attach(kit)
        yield kit


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


# -- the pytest plugin's database names -------------------------------------------------------

PREFIX_CONFTEST = (
    "import pytest\n"
    "from tests.support.models import SampleBase\n"
    "@pytest.fixture(scope='session')\n"
    "def outboxkit_metadata():\n"
    "    return SampleBase.metadata\n"
)
PREFIX_TEST = (
    "from sqlalchemy.engine import make_url\n"
    "def test_names(outboxkit_database_url, outboxkit_template):\n"
    "    print('NAMES', make_url(outboxkit_database_url).database, outboxkit_template.template)\n"
)


@pytest.mark.parametrize("configure", ["ini", "variable"])
def test_the_plugins_test_databases_take_the_configured_prefix(pytester, monkeypatch, configure):
    from tests.support.database import server_url

    monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_URL", server_url())
    monkeypatch.delenv("OUTBOXKIT_TEST_DATABASE_PREFIX", raising=False)
    pytester.makeconftest(PREFIX_CONFTEST)
    pytester.makepyfile(PREFIX_TEST)
    if configure == "ini":
        pytester.makeini("[pytest]\noutboxkit_database_prefix = shop_ini\n")
    else:
        pytester.makeini("[pytest]\noutboxkit_database_prefix = loses_to_the_variable\n")
        monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_PREFIX", "shop_variable")

    result = pytester.runpytest("-p", "outboxkit.pytest_plugin", "-p", "no:cacheprovider", "-s")

    result.assert_outcomes(passed=1)
    expected = "shop_ini" if configure == "ini" else "shop_variable"
    result.stdout.re_match_lines([rf".*NAMES {expected}_\d+_[0-9a-f]{{6}}_1 {expected}_\d+_[0-9a-f]{{6}}_template"])


# -- the row helpers with async SQLAlchemy objects -----------------------------------------------


def test_the_row_helpers_read_through_an_async_engine(engine, database_url):
    from sqlalchemy.ext.asyncio import create_async_engine

    [row_id] = add_events(engine, {"n": 1})
    async_engine = create_async_engine(database_url.replace("postgresql+psycopg://", "postgresql+psycopg_async://"))

    [row] = assert_enqueued(async_engine, SampleEvent, where={"payload": {"n": 1}})
    assert row.id == row_id
    assert [each.id for each in outbox_rows(async_engine, SampleEvent, status="pending")] == [row_id]


def test_the_row_helpers_refuse_an_async_session_naming_the_call_to_make(engine, database_url):
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    add_events(engine, {"n": 1})
    async_engine = create_async_engine(database_url.replace("postgresql+psycopg://", "postgresql+psycopg_async://"))

    async def check() -> int:
        async with AsyncSession(async_engine) as session:
            with pytest.raises(InvalidTypeError, match=r"await session\.run_sync\(assert_enqueued, OutboxClass"):
                assert_enqueued(session, SampleEvent)
            async with async_engine.connect() as connection:
                with pytest.raises(InvalidTypeError, match=r"await connection\.run_sync\(outbox_rows"):
                    outbox_rows(connection, SampleEvent)
            rows = await session.run_sync(assert_enqueued, SampleEvent)  # the documented way works
        await async_engine.dispose()
        return len(rows)

    assert asyncio.run(check()) == 1
