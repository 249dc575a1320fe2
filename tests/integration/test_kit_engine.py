"""The kit runs on psycopg 3 only: other drivers are refused with the URL to use; an AsyncEngine is accepted.

psycopg2, pg8000 and asyncpg are not dependencies.  SQLAlchemy imports a
driver when the engine is built, unless it is handed the module
(``create_engine(url, module=...)``); the refusal happens before any
connection, so a stand-in module is enough to build the engine the kit
must refuse.  Where psycopg2 itself is installed, the real module is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import outboxkit
from outboxkit import OutboxKit
from tests.support.database import libpq_url
from tests.support.models import SampleEvent
from tests.unit.test_kit_engine import kit_on


def test_the_url_from_database_url_runs_a_real_kit(database_url: str, insert_events, receiver, clock):
    """A bare libpq URL (what a platform hands you) becomes an engine the kit accepts and drains with."""
    engine = create_engine(outboxkit.database_url(libpq_url(database_url)))
    try:
        [row_id] = insert_events([{"n": 1}])
        with OutboxKit(engine, [SampleEvent], clock=clock) as kit:
            assert kit.drain_once(SampleEvent).delivered == 1
        with Session(engine) as session:
            assert session.get(SampleEvent, row_id).status == "done"
    finally:
        engine.dispose()


# -- an AsyncEngine --------------------------------------------------------------


@pytest.fixture
def async_engine(database_url: str) -> Iterator[AsyncEngine]:
    engine = create_async_engine(
        outboxkit.database_url(database_url), pool_size=3, max_overflow=2, pool_pre_ping=True, pool_recycle=600
    )
    yield engine
    asyncio.run(engine.dispose())


def test_an_async_engine_gets_a_sync_psycopg_twin_with_its_pool_settings(async_engine):
    kit = kit_on(async_engine)
    try:
        engine = kit.engine
        assert isinstance(engine, Engine) and engine is not async_engine.sync_engine
        assert (engine.dialect.driver, engine.dialect.is_async) == ("psycopg", False)
        assert engine.url == async_engine.url
        assert (engine.pool.size(), engine.pool._max_overflow) == (3, 2)
        assert (engine.pool._pre_ping, engine.pool._recycle) == (True, 600)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT 1").scalar() == 1
        pool = engine.pool
        assert pool.checkedin() == 1
    finally:
        kit.close()
    assert pool.checkedin() == 0  # close() disposed the engine the kit built, closing its connections


def test_an_async_engine_without_a_pool_gets_a_twin_without_one(database_url: str):
    async_engine = create_async_engine(outboxkit.database_url(database_url), poolclass=NullPool)
    try:
        with kit_on(async_engine) as kit:
            assert isinstance(kit.engine.pool, NullPool)
    finally:
        asyncio.run(async_engine.dispose())


def test_rows_enqueued_through_an_async_session_are_delivered_by_a_kit_on_the_async_engine(
    async_engine, receiver, clock
):
    """The outbox row is added in the same AsyncSession transaction as the business change."""

    async def enqueue() -> list[int]:
        async with AsyncSession(async_engine) as session, session.begin():
            events = [SampleEvent(target_url=f"{receiver.url}/events", payload={"n": n}) for n in (1, 2)]
            session.add_all(events)
            await session.flush()
            return [event.id for event in events]

    async def rolled_back() -> None:
        async with AsyncSession(async_engine) as session:
            async with session.begin():
                session.add(SampleEvent(target_url=f"{receiver.url}/events", payload={"n": "never"}))
                await session.flush()
                await session.rollback()  # the business change failed: its outbox row goes with it

    ids = asyncio.run(enqueue())
    asyncio.run(rolled_back())
    with OutboxKit(async_engine, [SampleEvent], clock=clock) as kit:
        assert kit.drain_once(SampleEvent).delivered == 2
    assert sorted(request.body["n"] for request in receiver.requests) == [1, 2]

    async def statuses() -> dict[int, str]:
        async with AsyncSession(async_engine) as session:
            return dict((await session.execute(select(SampleEvent.id, SampleEvent.status))).all())

    assert asyncio.run(statuses()) == {ids[0]: "done", ids[1]: "done"}


def test_rows_enqueued_with_core_insert_sync_and_async_get_the_delivery_defaults(engine, async_engine, receiver, clock):
    """A Core insert names only the application's columns; the kit's columns get their server defaults."""
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent).values(target_url=f"{receiver.url}/events", payload={"via": "sync"}))

    async def enqueue() -> None:
        async with async_engine.begin() as connection:
            await connection.execute(
                insert(SampleEvent), [{"target_url": f"{receiver.url}/events", "payload": {"via": "async"}}]
            )

    asyncio.run(enqueue())
    with Session(engine) as session:
        rows = session.scalars(select(SampleEvent).order_by(SampleEvent.id)).all()
        assert [(row.status, row.attempts) for row in rows] == [("pending", 0), ("pending", 0)]
        assert len({row.idempotency_key for row in rows}) == 2
    with OutboxKit(async_engine, [SampleEvent], clock=clock) as kit:
        assert kit.drain_once(SampleEvent).delivered == 2
    assert sorted(request.body["via"] for request in receiver.requests) == ["async", "sync"]


def test_outboxkit_imports_and_runs_without_greenlet(database_url):
    """A sync application need not install SQLAlchemy's asyncio extra (greenlet)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys\n"
        "sys.modules['greenlet'] = None  # an import of it now fails, as where it is not installed\n"
        "from sqlalchemy import create_engine\n"
        "import outboxkit\n"
        "from tests.support.models import SampleEvent\n"
        f"kit = outboxkit.OutboxKit(create_engine(outboxkit.database_url({database_url!r})), [SampleEvent])\n"
        "assert kit.drain_once(SampleEvent).ok\n"
        "kit.close()\n"
    )
    finished = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "admin")])})
    assert finished.returncode == 0, finished.stderr
