"""The database the kit talks to: PostgreSQL, through psycopg 3, on a sync engine.

The kit's queries, its outcome connections and its lock and LISTEN
connections are written for psycopg 3 (``postgresql+psycopg://``).  Under
another driver they misbehave quietly: with psycopg2 (what a bare
``postgresql://`` URL means under SQLAlchemy 2.0) every delivery is sent but
its outcome is never recorded, so the row is sent again after every lease.
So ``OutboxKit(...)`` refuses any other driver, and ``database_url`` turns the
URL an application already has into the one to use::

    >>> database_url("postgres://app:secret@db/app")
    'postgresql+psycopg://app:secret@db/app'

An ``AsyncEngine`` (``create_async_engine``, with psycopg or asyncpg) is
accepted too.  The kit drains
in threads, so it needs a sync engine: it builds its own psycopg engine on the
same database (``database_url`` of the async engine's URL) with the same pool
class, size, overflow, timeout, recycle and echo, and disposes it when the
kit closes.  It always pings a pooled connection before handing it out
(``pool_pre_ping``), so its first call after a server restart succeeds.  Its psycopg connections prepare no statements
(``prepare_threshold=None``, safe behind any pooler) unless
``OUTBOXKIT_PREPARED_STATEMENTS`` is on.  ``connect_args``, a ``creator``, event listeners and
``isolation_level`` given to ``create_async_engine`` do not carry over; if you
use them, build the sync engine yourself with the same arguments and pass
that.  The application's own ``AsyncSession`` keeps its engine and driver;
see docs/async.md.
"""

from __future__ import annotations

import sys

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool, QueuePool

from outboxkit.errors import ConfigurationError

__all__ = ["DRIVER_NAME", "database_url", "kit_engine"]

DRIVER_NAME = "postgresql+psycopg"
# Backend names SQLAlchemy reads as PostgreSQL; "postgres" is what Heroku and
# many platforms put in DATABASE_URL (SQLAlchemy itself refuses it).
_POSTGRES_BACKENDS = frozenset({"postgresql", "postgres"})
# libpq's sslmode values; asyncpg URLs say ssl=require, psycopg says sslmode=require.
_SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})


def database_url(url: str | URL) -> str:
    """The ``postgresql+psycopg://`` form of a PostgreSQL URL, the one outboxkit works with.

    Accepts ``postgres://``, ``postgresql://`` and any ``postgresql+<driver>://``
    (psycopg2, asyncpg, pg8000...); user, password, host, port, database and
    query are kept (an asyncpg-style ``ssl=require`` becomes ``sslmode=require``).
    A URL of another database raises ``ConfigurationError``.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(
            f"{_masked_text(url)!r} is not a database URL; expected e.g. postgresql+psycopg://user:password@host/database"
        ) from None
    backend = parsed.drivername.partition("+")[0]
    if backend not in _POSTGRES_BACKENDS:
        raise ConfigurationError(
            f"outboxkit needs PostgreSQL (it relies on SKIP LOCKED, advisory locks and NOTIFY); "
            f"{parsed.render_as_string(hide_password=True)} is a {backend!r} URL"
        )
    query = dict(parsed.query)
    ssl = query.get("ssl")
    if isinstance(ssl, str) and "sslmode" not in query:
        mode = "require" if ssl.lower() in ("true", "1") else ssl.lower()
        if mode in _SSL_MODES:
            del query["ssl"]
            query["sslmode"] = mode
    return parsed.set(drivername=DRIVER_NAME, query=query).render_as_string(hide_password=False)


def _is_async_engine(engine: object) -> bool:
    # An AsyncEngine exists only once sqlalchemy.ext.asyncio is imported, and importing it needs greenlet,
    # which a sync application may not have: look, never import.
    asyncio_extension = sys.modules.get("sqlalchemy.ext.asyncio")
    return asyncio_extension is not None and isinstance(engine, asyncio_extension.AsyncEngine)


def kit_engine(engine: object, *, prepared_statements: bool = False) -> Engine:
    """The sync psycopg engine the kit runs on: ``engine`` itself, or one derived from an ``AsyncEngine``.

    Refuses, with the URL to use, anything that is not PostgreSQL through
    psycopg 3.  A derived engine is new (it is not ``engine``); the caller
    owns it and disposes it.  Its psycopg connections prepare nothing
    (``prepare_threshold=None``) unless ``prepared_statements``; an engine the
    application passes is used as it is (see docs/operations.md for what it
    needs behind a transaction-mode pooler).
    """
    derive = _is_async_engine(engine)
    if derive:
        engine = engine.sync_engine  # type: ignore[attr-defined]
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"OutboxKit needs a SQLAlchemy Engine or AsyncEngine, got {type(engine).__name__}: "
            "OutboxKit(create_engine(outboxkit.database_url(url)), outboxes=[...])"
        )
    if engine.dialect.name != "postgresql":
        raise ConfigurationError(
            f"outboxkit needs PostgreSQL (it relies on SKIP LOCKED, advisory locks and NOTIFY); "
            f"the engine is {engine.dialect.name!r}. Use a '{DRIVER_NAME}://' URL."
        )
    if derive:
        return _sync_twin(engine, prepared_statements=prepared_statements)
    if engine.dialect.driver != "psycopg" or engine.dialect.is_async:
        shown = engine.url.render_as_string(hide_password=True)
        use = make_url(database_url(engine.url)).render_as_string(hide_password=True)
        # An async dialect on a sync Engine is usually AsyncEngine.sync_engine, which still drives async connections.
        driver = f"the async driver {engine.dialect.driver!r}" if engine.dialect.is_async else repr(engine.dialect.driver)
        raise ConfigurationError(
            f"outboxkit works only with the psycopg 3 driver on a sync engine; this engine uses {driver} ({shown}). "
            f"Build it from {use}, e.g. create_engine(outboxkit.database_url(url)); an AsyncEngine may be passed "
            "as it is (the kit then builds its own sync psycopg engine). psycopg 3 comes with outboxkit"
        )
    return engine


def _sync_twin(engine: Engine, *, prepared_statements: bool) -> Engine:
    """A sync psycopg engine on the same database with the same pool settings (see the module docstring)."""
    pool = engine.pool
    options: dict[str, object] = {
        "connect_args": {} if prepared_statements else {"prepare_threshold": None},
        "echo": engine.echo,
        "pool_pre_ping": True,  # whatever the async engine says: the kit's calls survive a server restart
        "pool_recycle": getattr(pool, "_recycle", -1),
    }
    if isinstance(pool, NullPool):
        options["poolclass"] = NullPool
    elif isinstance(pool, QueuePool):  # AsyncAdaptedQueuePool is one
        options.update(pool_size=pool.size(), max_overflow=getattr(pool, "_max_overflow", 10), pool_timeout=pool.timeout())
    return create_engine(database_url(engine.url), **options)


def _masked_text(url: object) -> str:
    """A URL that did not parse, with anything between ``:`` and ``@`` (a password) hidden."""
    text = str(url)
    scheme, separator, rest = text.partition("://")
    if not separator or "@" not in rest:
        return text
    credentials, _, host = rest.rpartition("@")
    user = credentials.partition(":")[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else text
