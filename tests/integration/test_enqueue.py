"""The enqueue fast path writes what the ORM path writes, in the caller's transaction, and refuses bad rows whole."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.orm import Session

from outboxkit import InvalidTypeError, InvalidValueError, enqueue, enqueue_many
from outboxkit.storage.notify import channel_for, drop_trigger_sql
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent

TARGET = "http://127.0.0.1:9/events"
# Every column the kit or the application owns, but the identity and the moments of writing.
COMPARED = ("status", "attempts", "target_url", "kind", "payload", "last_error", "last_status_code",
            "delivered_at", "claimed_until", "claim_token")  # fmt: skip


def rows_by_key(engine) -> dict[uuid.UUID, SampleEvent]:
    with Session(engine) as session:
        return {row.idempotency_key: row for row in session.scalars(select(SampleEvent).order_by(SampleEvent.id))}


def count_rows(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM sample_event_outbox")).scalar_one()


# -- defaults ----------------------------------------------------------------------


def test_a_row_gets_the_defaults_the_orm_path_gives(engine):
    with Session(engine) as session, session.begin():
        orm_row = SampleEvent(target_url=TARGET)
        session.add(orm_row)
        session.flush()
        orm_key = orm_row.idempotency_key
        key = enqueue(session, SampleEvent, {"target_url": TARGET})
        transaction_start = session.execute(text("SELECT now()")).scalar_one()

    rows = rows_by_key(engine)
    fast, orm = rows[key], rows[orm_key]
    assert isinstance(key, uuid.UUID) and key != orm_key
    assert {name: getattr(fast, name) for name in COMPARED} == {name: getattr(orm, name) for name in COMPARED}
    assert (fast.status, fast.attempts, fast.kind, fast.payload) == ("pending", 0, "event", {})
    assert fast.next_attempt_at == fast.created_at == fast.updated_at == transaction_start
    assert fast.claimed_until is None and fast.claim_token is None and fast.delivered_at is None


def test_a_row_may_set_its_key_and_its_due_time(engine):
    key, due = uuid.uuid4(), datetime(2031, 5, 1, 9, 30, tzinfo=timezone.utc)
    with engine.begin() as connection:  # a Core connection, not a session
        returned = enqueue(connection, SampleEvent, {"target_url": TARGET, "idempotency_key": key, "next_attempt_at": due})
    row = rows_by_key(engine)[key]
    assert returned == key
    assert row.next_attempt_at == due and row.created_at < due


def test_a_session_with_one_bind_per_table_writes_through_the_outbox_bind(engine):
    with Session(binds={SampleEvent: engine}) as session, session.begin():  # no default bind
        enqueue(session, SampleEvent, {"target_url": TARGET})
        enqueue_many(session, SampleEvent, [{"target_url": TARGET}] * 3)
    assert count_rows(engine) == 4


def test_many_rows_keep_their_order_when_they_set_different_columns(engine):
    due = datetime(2031, 1, 1, tzinfo=timezone.utc)
    rows = [{"target_url": TARGET, "payload": {"n": n}} for n in range(6)]
    rows[2]["next_attempt_at"] = due  # splits the batch into three statements
    with Session(engine) as session, session.begin():
        keys = enqueue_many(session, SampleEvent, rows)

    written = rows_by_key(engine)
    assert list(written) == keys  # id order is the order given
    assert [written[key].payload["n"] for key in keys] == list(range(6))
    assert written[keys[2]].next_attempt_at == due
    assert all(written[key].next_attempt_at < due for key in keys if key != keys[2])


def test_an_enqueued_row_is_delivered_with_its_key(engine, make_drainer, receiver):
    with Session(engine) as session, session.begin():
        key = enqueue(session, SampleEvent, {"target_url": receiver.url + "/events", "payload": {"order": 7}})

    result = make_drainer().drain_once()

    assert result.delivered == 1
    assert [(request.key, request.body) for request in receiver.requests] == [(str(key), {"order": 7})]
    assert rows_by_key(engine)[key].status == "done"


# -- validation: a clear error, nothing written --------------------------------------


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"target_url": TARGET, "colour": "red"}, InvalidValueError, "no column(s) 'colour' in sample_event_outbox"),
        ({"target_url": TARGET, "status": "done"}, InvalidValueError, "'status' belong to the kit's delivery state"),
        ({"target_url": TARGET, "attempts": 3}, InvalidValueError, "'attempts' belong to the kit's delivery state"),
        ({"payload": {}}, InvalidValueError, "column 'target_url' is required"),
        ({"target_url": None}, InvalidValueError, "column 'target_url' is NOT NULL, got None"),
        ({"target_url": TARGET, "idempotency_key": "abc"}, InvalidTypeError, "idempotency_key must be a uuid.UUID"),
        ({"target_url": TARGET, "next_attempt_at": datetime(2031, 1, 1)}, InvalidValueError, "must be an aware datetime"),
        (["target_url", TARGET], InvalidTypeError, "a row is a mapping of column names to values"),
    ],
    ids=["unknown", "status", "attempts", "missing", "none", "key", "naive", "not-a-mapping"],
)
def test_a_bad_row_is_refused_before_anything_is_written(engine, values, error, message):
    with Session(engine) as session, session.begin():
        with pytest.raises(error) as raised:
            enqueue(session, SampleEvent, values)
        assert message in str(raised.value)
        # Nothing reached the database: the caller's transaction is still usable.
        enqueue(session, SampleEvent, {"target_url": TARGET})
    assert count_rows(engine) == 1


def test_one_bad_row_in_a_batch_refuses_the_whole_batch_and_names_the_row(engine):
    rows = [{"target_url": TARGET} for _ in range(500)]
    rows[321] = {"target_url": TARGET, "claim_token": uuid.uuid4()}
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidValueError, match=r"SampleEvent row 321: column\(s\) 'claim_token' belong to the kit"):
            enqueue_many(session, SampleEvent, rows)
    assert count_rows(engine) == 0


def test_bad_arguments_are_refused(engine):
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidTypeError, match="iterable of rows"):
            enqueue_many(session, SampleEvent, {"target_url": TARGET})
        with pytest.raises(InvalidValueError, match="copy_threshold must be a positive integer"):
            enqueue_many(session, SampleEvent, [{"target_url": TARGET}], copy_threshold=0)
        with pytest.raises(InvalidTypeError, match="a mapped Outbox subclass"):
            enqueue(session, dict, {"target_url": TARGET})  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="Session or Connection, got Engine"):
            enqueue(engine, SampleEvent, {"target_url": TARGET})  # type: ignore[arg-type]
    assert enqueue_many(engine.connect(), SampleEvent, []) == []
    assert count_rows(engine) == 0


# -- the caller's transaction ------------------------------------------------------


@pytest.mark.parametrize("copy_threshold", [1, 10_000], ids=["copy", "insert"])
def test_a_rollback_leaves_no_row(engine, copy_threshold):
    with Session(engine) as session:
        with session.begin():
            enqueue(session, SampleEvent, {"target_url": TARGET})
            enqueue_many(session, SampleEvent, [{"target_url": TARGET}] * 300, copy_threshold=copy_threshold)
            assert session.execute(text("SELECT count(*) FROM sample_event_outbox")).scalar_one() == 301
            session.rollback()
    assert count_rows(engine) == 0


def test_copy_writes_the_same_rows_as_insert(engine):
    due = datetime(2031, 2, 3, 4, 5, tzinfo=timezone.utc)
    rows = [
        {"target_url": f"{TARGET}/{n}", "payload": {"n": n, "nested": [1, "two", None]}, "kind": f"k{n % 3}",
         "next_attempt_at": due + timedelta(seconds=n)}
        for n in range(400)
    ]  # fmt: skip
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with Session(engine) as session, session.begin():
        copied = enqueue_many(session, SampleEvent, rows, copy_threshold=len(rows))
    assert not any("INSERT" in statement for statement in statements)  # COPY wrote them, not SQLAlchemy
    with Session(engine) as session, session.begin():
        inserted = enqueue_many(session, SampleEvent, rows, copy_threshold=len(rows) + 1)
    assert any("INSERT" in statement for statement in statements)

    written = rows_by_key(engine)
    columns = (*COMPARED, "next_attempt_at")
    assert [[getattr(written[key], name) for name in columns] for key in copied] == [
        [getattr(written[key], name) for name in columns] for key in inserted
    ]
    assert list(written) == copied + inserted
    assert [written[key].payload["n"] for key in copied] == list(range(400))


# -- NOTIFY --------------------------------------------------------------------------


def notifications_until_marker(listener: psycopg.Connection, database_url: str, channel: str) -> list[str]:
    """Every notification on ``channel`` up to a marker sent last: what the enqueues sent, in commit order."""
    with psycopg.connect(database_url, autocommit=True) as sender:
        sender.execute("SELECT pg_notify(%s, 'marker')", [channel])
    payloads = []
    for notification in listener.notifies(timeout=30):
        if notification.payload == "marker":
            return payloads
        payloads.append(notification.payload)
    raise AssertionError(f"the marker never arrived; got {payloads}")


@pytest.fixture
def listener(database_url):
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f'LISTEN "{channel_for(SampleEvent)}"')
        yield connection


@pytest.mark.parametrize("copy_threshold", [1, 10_000], ids=["copy", "insert"])
def test_a_commit_notifies_once_and_a_rollback_sends_nothing(engine, database_url, listener, copy_threshold):
    channel = channel_for(SampleEvent)
    with Session(engine) as session:
        with session.begin():
            enqueue_many(session, SampleEvent, [{"target_url": TARGET}] * 50, copy_threshold=copy_threshold)
            session.rollback()
    assert notifications_until_marker(listener, database_url, channel) == []

    with Session(engine) as session, session.begin():
        enqueue(session, SampleEvent, {"target_url": TARGET})
        enqueue_many(session, SampleEvent, [{"target_url": TARGET}] * 50, copy_threshold=copy_threshold)
    # The statement trigger fired twice in one transaction; PostgreSQL delivers identical notifications once.
    assert notifications_until_marker(listener, database_url, channel) == [""]


def test_without_the_trigger_notify_true_sends_the_notification(engine, database_url, listener):
    with engine.begin() as connection:
        for statement in drop_trigger_sql(SampleEvent):
            connection.execute(text(statement))
    channel = channel_for(SampleEvent)

    with Session(engine) as session, session.begin():
        enqueue(session, SampleEvent, {"target_url": TARGET})
    assert notifications_until_marker(listener, database_url, channel) == []

    with Session(engine) as session:
        with session.begin():
            enqueue_many(session, SampleEvent, [{"target_url": TARGET}] * 5, notify=True)
            session.rollback()
    with Session(engine) as session, session.begin():
        enqueue(session, SampleEvent, {"target_url": TARGET}, notify=True)
    assert notifications_until_marker(listener, database_url, channel) == [""]
    assert count_rows(engine) == 2


# -- an AsyncSession -------------------------------------------------------------------


def test_an_async_session_enqueues_through_run_sync(engine, database_url):
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from tests.support.database import sqlalchemy_url

    async def place() -> list[uuid.UUID]:
        async_engine = create_async_engine(sqlalchemy_url(database_url))
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                first = await session.run_sync(enqueue, SampleEvent, {"target_url": TARGET})
                # Past the COPY threshold: on an async driver the rows go through INSERT instead.
                rest = await session.run_sync(enqueue_many, SampleEvent, [{"target_url": TARGET}] * 250)
            return [first, *rest]
        finally:
            await async_engine.dispose()

    keys = asyncio.run(place())
    assert list(rows_by_key(engine)) == keys and len(keys) == 251


def test_enqueue_async_inserts_in_the_async_sessions_transaction_on_the_event_loops_thread(engine, database_url):
    import asyncio
    import threading

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from outboxkit import enqueue_async

    async_engine = create_async_engine(sqlalchemy_url(database_url))
    threads: list[str] = []
    event.listen(
        async_engine.sync_engine, "before_cursor_execute", lambda *args: threads.append(threading.current_thread().name)
    )

    async def run() -> tuple[uuid.UUID, str]:
        async with AsyncSession(async_engine) as session:
            async with session.begin():
                key = await enqueue_async(session, SampleEvent, {"target_url": "http://127.0.0.1:9/x", "payload": {"n": 1}})
            async with session.begin():  # rolled back: leaves no row
                await enqueue_async(session, SampleEvent, {"target_url": "http://127.0.0.1:9/x", "payload": {"n": 2}})
                await session.rollback()
        await async_engine.dispose()
        return key, threading.current_thread().name

    key, loop_thread = asyncio.run(run())
    assert threads and set(threads) == {loop_thread}  # every statement ran on the event loop's thread
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT idempotency_key, payload FROM sample_event_outbox")).all()
    assert rows == [(key, {"n": 1})]
    with pytest.raises(InvalidTypeError, match="AsyncSession or AsyncConnection"):
        asyncio.run(enqueue_async(Session(engine), SampleEvent, {"target_url": "http://127.0.0.1:9/x"}))  # type: ignore[arg-type]
