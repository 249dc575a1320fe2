"""The engines the kit builds itself answer their first call after every session of theirs ended.

A server restart ends every session at once; to a client's pool it looks
like ``pg_terminate_backend`` on each of its connections, which is what these
tests do (on the test's own database; the shared server is never
restarted).  The connections stay in the pool, stale, until a checkout
finds out: each engine the kit builds pings a connection before handing it
out, so the first call after a restart succeeds instead of failing once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from outboxkit import OutboxKit
from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.store import ScheduleStore
from outboxkit.storage.database import kit_engine
from outboxkit.storage.operator_pool import APPLICATION_NAME
from tests.support.database import sqlalchemy_url
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent

pytest_plugins = ["pytester"]

TIMEOUT = 30.0


def end_sessions(engine: Engine, where: str, parameters: dict[str, object]) -> None:
    """End the sessions of this test's database that ``where`` picks, and wait until they are gone."""
    picked = f"datname = current_database() AND pid <> pg_backend_pid() AND {where}"
    with engine.connect() as connection:
        ended = connection.execute(
            text(f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {picked}"), parameters
        ).scalar_one()
    assert ended >= 1

    def gone() -> bool:
        with engine.connect() as connection:
            left = connection.execute(text(f"SELECT count(*) FROM pg_stat_activity WHERE {picked}"), parameters)
            return left.scalar_one() == 0

    wait_until(gone, timeout=TIMEOUT, message="the ended sessions gone")


@pytest.fixture
def kit(engine: Engine) -> Iterator[OutboxKit]:
    kit = OutboxKit(engine, [SampleEvent])  # the application's engine pings nothing
    yield kit
    kit.close()


def test_the_admin_schedule_store_answers_its_first_call_after_a_restart(kit, engine):
    store = ScheduleStore(kit.operator_database, clock=kit.clock, jobs=["tick"])
    store.create(ScheduleDefinition(name="tick", trigger=ScheduleTrigger.every(minutes=1), target=JobTarget(job="tick")),
                 actor="alice")
    assert [schedule.name for schedule in store.list()] == ["tick"]

    end_sessions(engine, "application_name = :name", {"name": APPLICATION_NAME})

    assert [schedule.name for schedule in store.list()] == ["tick"]  # the first call after it, not a retry
    store.set_enabled("tick", False, actor="alice")


def test_the_engine_derived_from_an_async_engine_answers_its_first_call_after_a_restart(database_url, engine):
    from sqlalchemy.ext.asyncio import create_async_engine

    async_engine = create_async_engine(sqlalchemy_url(database_url))  # no pre-ping asked for
    derived = kit_engine(async_engine)
    try:
        with derived.connect() as connection:
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()

        end_sessions(engine, "pid = :pid", {"pid": pid})

        with derived.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        derived.dispose()


PLUGIN_CONFTEST = (
    "import pytest\n"
    "from tests.support.models import SampleBase\n"
    "@pytest.fixture(scope='session')\n"
    "def outboxkit_metadata():\n"
    "    return SampleBase.metadata\n"
)
PLUGIN_TEST = (
    "import psycopg\n"
    "from sqlalchemy import text\n"
    "from sqlalchemy.engine import make_url\n"
    "from tests.support.leadership import wait_until\n"
    "def test_first_call_after_a_restart(outboxkit_engine, outboxkit_database_url):\n"
    "    with outboxkit_engine.connect() as connection:\n"
    "        pid = connection.execute(text('SELECT pg_backend_pid()')).scalar_one()\n"
    "    libpq = make_url(outboxkit_database_url).set(drivername='postgresql').render_as_string(hide_password=False)\n"
    "    with psycopg.connect(libpq, autocommit=True) as other:\n"
    "        other.execute('SELECT pg_terminate_backend(%s)', (pid,))\n"
    "        alive = 'SELECT count(*) FROM pg_stat_activity WHERE pid = %s'\n"
    "        wait_until(lambda: other.execute(alive, (pid,)).fetchone()[0] == 0, timeout=30, message='gone')\n"
    "    with outboxkit_engine.connect() as connection:\n"
    "        assert connection.execute(text('SELECT 1')).scalar_one() == 1\n"
)


def test_the_pytest_plugins_engine_answers_its_first_call_after_a_restart(pytester, monkeypatch):
    from tests.support.database import server_url

    monkeypatch.setenv("OUTBOXKIT_TEST_DATABASE_URL", server_url())
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(PLUGIN_TEST)

    result = pytester.runpytest("-p", "outboxkit.pytest_plugin", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
