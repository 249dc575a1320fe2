"""The kit runs on psycopg 3 only: other drivers and sync sides of async engines are refused with the fix.

psycopg2, pg8000 and asyncpg are not dependencies.  SQLAlchemy imports a
driver when the engine is built, unless it is handed the module
(``create_engine(url, module=...)``); the refusal happens before any
connection, so a stand-in module is enough to build the engine the kit
must refuse.  Where psycopg2 itself is installed, the real module is used.
The AsyncEngine tests are in tests/integration/test_kit_engine.py.
"""

from __future__ import annotations

import sys
import types

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import outboxkit
from outboxkit import CallableTransport, ConfigurationError, OutboxKit
from tests.support.models import SampleEvent

URL_WITH_PASSWORD = "{driver}://app:s3cret@db.internal:5432/shop"
PSYCOPG_URL_MASKED = "postgresql+psycopg://app:***@db.internal:5432/shop"


def stand_in_driver(monkeypatch: pytest.MonkeyPatch, name: str, paramstyle: str, version: str) -> types.ModuleType:
    """A module SQLAlchemy accepts as the DBAPI at engine build time; it is never connected through."""
    module = types.ModuleType(name)
    module.paramstyle = paramstyle  # type: ignore[attr-defined]
    module.__version__ = version  # type: ignore[attr-defined]
    if name == "psycopg2":  # the psycopg2 dialect reads psycopg2.extras while it is built
        extras = types.ModuleType("psycopg2.extras")
        module.extras = extras  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "psycopg2", module)
        monkeypatch.setitem(sys.modules, "psycopg2.extras", extras)
    return module


def foreign_engine(monkeypatch: pytest.MonkeyPatch, driver: str) -> Engine:
    url = URL_WITH_PASSWORD.format(driver=f"postgresql+{driver}")
    if driver == "psycopg2":
        try:
            import psycopg2  # noqa: F401  (used when installed)

            return create_engine(url)
        except ImportError:
            return create_engine(url, module=stand_in_driver(monkeypatch, "psycopg2", "pyformat", "2.9.9 (dt dec pq3 ext lo64)"))
    return create_engine(url, module=stand_in_driver(monkeypatch, driver, "format", "1.31.2"))


def kit_on(engine: Engine | AsyncEngine) -> OutboxKit:
    return OutboxKit(engine, [SampleEvent], transport=CallableTransport(lambda delivery, key: 200))


# -- refused drivers -------------------------------------------------------------


@pytest.mark.parametrize("driver", ["psycopg2", "pg8000"])
def test_another_driver_is_refused_with_the_psycopg_url_and_the_password_masked(monkeypatch, driver):
    engine = foreign_engine(monkeypatch, driver)
    try:
        assert engine.dialect.driver == driver
        with pytest.raises(ConfigurationError) as raised:
            kit_on(engine)
    finally:
        engine.dispose()
    message = str(raised.value)
    assert f"works only with the psycopg 3 driver on a sync engine; this engine uses {driver!r}" in message
    assert f"Build it from {PSYCOPG_URL_MASKED}" in message
    assert "outboxkit.database_url(url)" in message
    assert "s3cret" not in message


def test_the_sync_side_of_an_async_engine_is_refused_with_the_fix():
    async_engine = create_async_engine(URL_WITH_PASSWORD.format(driver="postgresql+psycopg"))
    try:
        with pytest.raises(ConfigurationError) as raised:
            kit_on(async_engine.sync_engine)
    finally:
        async_engine.sync_engine.dispose()
    message = str(raised.value)
    assert "this engine uses the async driver 'psycopg'" in message
    assert "an AsyncEngine may be passed as it is" in message
    assert "s3cret" not in message


def test_something_that_is_not_an_engine_is_refused():
    with pytest.raises(ConfigurationError, match=r"needs a SQLAlchemy Engine or AsyncEngine, got str.*database_url"):
        kit_on("postgresql://app@db/shop")  # type: ignore[arg-type]


# -- database_url ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgres://u:p@h:6543/db", "postgresql+psycopg://u:p@h:6543/db"),
        ("postgresql+psycopg2://u:p@h/db?sslmode=require", "postgresql+psycopg://u:p@h/db?sslmode=require"),
        ("postgresql+asyncpg://u@h/db?ssl=require", "postgresql+psycopg://u@h/db?sslmode=require"),
        ("postgresql+asyncpg://u@h/db?ssl=true", "postgresql+psycopg://u@h/db?sslmode=require"),
        ("postgresql+pg8000://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u:p%40ss@h/db", "postgresql+psycopg://u:p%40ss@h/db"),
        ("postgresql:///db?host=/run/postgresql", "postgresql+psycopg:///db?host=%2Frun%2Fpostgresql"),
    ],
)
def test_database_url_normalises_a_postgresql_url_to_psycopg(given, expected):
    assert outboxkit.database_url(given) == expected


def test_database_url_accepts_a_sqlalchemy_url_object():
    engine = create_engine("postgresql+psycopg://u:p@h/db")
    try:
        assert outboxkit.database_url(engine.url) == "postgresql+psycopg://u:p@h/db"  # the password is kept, not masked
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        ("mysql://u:s3cret@h/db", r"needs PostgreSQL.*mysql://u:\*\*\*@h/db is a 'mysql' URL"),
        ("sqlite:///app.db", r"is a 'sqlite' URL"),
        ("not a url", r"'not a url' is not a database URL"),
    ],
)
def test_database_url_refuses_another_database(given, complaint):
    with pytest.raises(ConfigurationError, match=complaint) as raised:
        outboxkit.database_url(given)
    assert "s3cret" not in str(raised.value)


# -- an AsyncEngine --------------------------------------------------------------


