"""publish_async: the event and its deliveries on an AsyncSession, in the caller's transaction, awaited on the
event loop's own thread (no thread hop); the same refusals as publish."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outboxkit import EventDelivery, InvalidEventError
from outboxkit.events.publish_async import publish_async
from outboxkit.storage.tables import events
from tests.support.events import definition, events_kit  # noqa: F401  (fixture)


def run_async(engine, body):
    async def main():
        async_engine = create_async_engine(engine.url.set(drivername="postgresql+psycopg_async"))
        threads: set[int] = set()
        event.listen(async_engine.sync_engine, "before_cursor_execute", lambda *args: threads.add(threading.get_ident()))
        try:
            result = await body(async_engine)
        finally:
            await async_engine.dispose()
        return result, threads, threading.get_ident()

    return asyncio.run(main())


def counts(engine) -> tuple[int, int]:
    with engine.connect() as connection:
        return (connection.scalar(select(func.count()).select_from(events)),
                connection.scalar(select(func.count()).select_from(EventDelivery.__table__)))


def test_publish_async_writes_in_the_callers_transaction_on_the_loops_thread(events_kit):
    store = events_kit.events.subscriptions
    store.create(definition("http://127.0.0.1:9/a", "invoice.*"), actor="a")
    store.create(definition("http://127.0.0.1:9/b", "invoice.paid", seed=2), actor="a")

    async def body(async_engine):
        async with AsyncSession(async_engine) as session, session.begin():
            published = await publish_async(session, "invoice.paid", {"invoice": 7}, key="7")
        async with AsyncSession(async_engine) as session:
            async with session.begin():
                await publish_async(session, "invoice.paid", {"invoice": 8})
                await session.rollback()  # the caller's change rolls back: so do the event and its deliveries
        return published

    published, threads, loop_thread = run_async(events_kit.engine, body)
    assert published.deliveries == 2
    assert counts(events_kit.engine) == (1, 2)
    assert threads == {loop_thread}


def test_publish_async_refuses_as_publish_does_and_writes_nothing(events_kit):
    async def body(async_engine):
        async with AsyncSession(async_engine) as session, session.begin():
            with pytest.raises(InvalidEventError, match="event_type"):
                await publish_async(session, "not a type", {})
            with pytest.raises(InvalidEventError, match="payload"):
                await publish_async(session, "invoice.paid", {"blob": "x" * 300_000})
            with pytest.raises(InvalidEventError, match="catalog"):
                await publish_async(session, "invoice.paid", {}, strict=True)

    run_async(events_kit.engine, body)
    assert counts(events_kit.engine) == (0, 0)
