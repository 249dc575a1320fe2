"""Finding a PostgreSQL server for the tests and giving each test its own database.

Order: ``OUTBOXKIT_TEST_DATABASE_URL`` or ``DATABASE_URL`` if set; else
``postgresql://root@127.0.0.1:5432/test`` if it answers; else an embedded
server (the ``pgserver`` wheel) started in a cache folder, so the suite runs
on a laptop with no database.

Each test gets a fresh database cloned from a template that already holds
the schema (``CREATE DATABASE ... TEMPLATE``): cheap, and complete isolation
(advisory locks and NOTIFY channels are per database too).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path

import psycopg
from sqlalchemy import MetaData, create_engine
from sqlalchemy.engine import make_url

from outboxkit.embedded import EmbeddedPostgres, default_data_dir

LOCAL_URL = "postgresql://root@127.0.0.1:5432/test"


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def server_url() -> str:
    """A libpq URL of a database on a server the tests may create databases on."""
    for name in ("OUTBOXKIT_TEST_DATABASE_URL", "DATABASE_URL"):
        url = os.environ.get(name)
        if url:
            return libpq_url(url)
    if _answers(LOCAL_URL):
        return LOCAL_URL
    return embedded_server_url()


def embedded_server_url() -> str:
    """Start (or reuse) the embedded server; it stops when the test process exits."""
    data = Path(os.environ.get("OUTBOXKIT_TEST_PGDATA") or default_data_dir("test-pgdata"))
    return _EMBEDDED.setdefault("server", EmbeddedPostgres(data)).start()


_EMBEDDED: dict[str, EmbeddedPostgres] = {}


def libpq_url(url: str) -> str:
    """Strip a SQLAlchemy driver suffix: ``postgresql+psycopg://`` -> ``postgresql://``."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def sqlalchemy_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


class DatabaseFactory:
    """Creates a template database once and clones it per test."""

    def __init__(self, server: str, metadatas: Iterable[MetaData]) -> None:
        self.server = server
        self.prefix = f"okt_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.template = f"{self.prefix}_template"
        self._execute(f'CREATE DATABASE "{self.template}"')
        engine = create_engine(sqlalchemy_url(with_database(server, self.template)))
        try:
            for metadata in metadatas:
                metadata.create_all(engine)
        finally:
            engine.dispose()
        self._count = 0

    def create(self) -> str:
        """A fresh database with the schema; returns its libpq URL."""
        self._count += 1
        name = f"{self.prefix}_{self._count}"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return with_database(self.server, name)

    def create_empty(self) -> str:
        self._count += 1
        name = f"{self.prefix}_{self._count}"
        self._execute(f'CREATE DATABASE "{name}"')
        return with_database(self.server, name)

    def drop(self, url: str) -> None:
        name = make_url(url).database
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')

    def _execute(self, statement: str) -> None:
        # A fresh connection each time: a fault test may have restarted the server.
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(statement)
