"""Finding a PostgreSQL server for the tests and giving each test its own database.

Order: ``OUTBOXKIT_TEST_DATABASE_URL`` or ``DATABASE_URL`` if set; else
``postgresql://root@127.0.0.1:5432/test`` if it answers; else an embedded
server (the ``pgserver`` wheel) started in a cache folder, so the suite runs
on a laptop with no database.

Each test gets a fresh database cloned from a template that already holds
the schema (``CREATE DATABASE ... TEMPLATE``): cheap, and complete isolation
(advisory locks and NOTIFY channels are per database too).  The template
and the clones are the shipped pytest plugin's ``TemplateDatabase``
(outboxkit/pytest_plugin.py), the same machinery applications' suites use.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psycopg
from sqlalchemy import Engine, MetaData
from sqlalchemy.engine import make_url

from outboxkit.pytest_plugin import TemplateDatabase
from outboxkit.storage.embedded import EmbeddedPostgres, default_data_dir

LOCAL_URL = "postgresql://root@127.0.0.1:5432/test"
# Clones kept ready for the next tests (DatabaseFactory).
SPARES = 2


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


class DatabaseFactory:
    """The shipped plugin's ``TemplateDatabase``, built once from ``metadatas``, handing out libpq URLs.

    ``create_all`` fires the ``after_create`` listeners tests/conftest.py
    attaches, so the template's outboxes carry their NOTIFY triggers.

    Cloning and dropping run beside the tests, on two helper threads:
    ``create`` hands out a clone made while earlier tests ran and asks for
    another (``SPARES`` are kept ready, for a run of quick tests), and
    ``discard`` (the ``database_url`` fixture's teardown) drops a database
    on the other thread.  Each costs the server an fsync, and each ``DROP
    DATABASE`` a checkpoint (PostgreSQL 15): 0.3 s to 2 s a test on a loaded
    host, which the tests no longer wait for.  ``drop`` still drops at once,
    for the tests that take a database away mid-test.
    """

    def __init__(self, server: str, metadatas: Iterable[MetaData]) -> None:
        metadatas = list(metadatas)

        def create_schema(engine: Engine) -> None:
            for metadata in metadatas:
                metadata.create_all(engine)

        self.server = server
        self._template = TemplateDatabase(server, create_schema)
        self._cloner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-database-clones")
        self._dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-database-drops")
        self._spares: deque[Future[str]] = deque(self._cloner.submit(self._template.create) for _ in range(SPARES))
        self._discarded: list[Future[None]] = []

    def create(self) -> str:
        """A fresh database with the schema; returns its libpq URL."""
        url = self._spares.popleft().result()
        self._spares.append(self._cloner.submit(self._template.create))
        return libpq_url(url)

    def create_empty(self) -> str:
        """A fresh database without the schema (the migration tests run their own); returns its libpq URL."""
        return libpq_url(self._template.create_empty())

    def drop(self, url: str) -> None:
        """Drop the database now (its sessions are terminated)."""
        self._template.drop(url)

    def discard(self, url: str) -> None:
        """Drop the database on a helper thread; a failure is raised by ``close``."""
        self._discarded = [future for future in self._discarded if not future.done() or future.exception()]
        self._discarded.append(self._dropper.submit(self._template.drop, url))

    def close(self) -> None:
        try:
            self._cloner.shutdown(wait=True)
            for spare in self._spares:
                if spare.exception() is None:
                    self._discarded.append(self._dropper.submit(self._template.drop, spare.result()))
            self._dropper.shutdown(wait=True)
            for future in self._discarded:
                future.result()  # a database that could not be made or dropped
        finally:
            self._template.close()
