"""pytest fixtures for applications that use outboxkit: a migrated database and a kit per test.

Installing outboxkit registers this plugin (the ``pytest11`` entry point
``outboxkit.pytest_plugin``); with plugin autoloading off, enable it with
``pytest_plugins = ["outboxkit.pytest_plugin"]`` in your top-level
conftest.py.  It is inert: its one hook declares one ini option
(``outboxkit_database_prefix``, below), and a fixture does nothing until a
test requests it.  Every fixture is named ``outboxkit_*``.

Configure it in your conftest.py by overriding two fixtures (or setting one
environment variable)::

    @pytest.fixture(scope="session")
    def outboxkit_metadata():
        return Base.metadata                 # your models, outboxes included

    # the server: OUTBOXKIT_TEST_DATABASE_URL=postgresql://user@127.0.0.1/postgres
    # or override the session fixture outboxkit_server_url

The fixtures, from the bottom up:

``outboxkit_server_url`` (session)
    A database on the server where the plugin may ``CREATE DATABASE``.
``outboxkit_database_prefix`` (session)
    How the test databases' names start (``outboxkit_test`` by default):
    ``OUTBOXKIT_TEST_DATABASE_PREFIX`` or the ini option
    ``outboxkit_database_prefix``, the variable first.  Lower-case letters,
    digits and ``_``, at most 30 characters, so a shared server shows whose
    databases are whose.
``outboxkit_metadata`` (session)
    Your ``MetaData`` (or a list of them).  Required.
``outboxkit_create_schema`` (session)
    ``create_schema(engine)`` builds the schema in the template database:
    by default ``create_all`` of your metadata and the kit's tables, plus the
    NOTIFY trigger on every outbox.  Override it to run your Alembic
    migrations instead (docs/testing.md shows how).
``outboxkit_template`` (session)
    The template database, built once; each test gets a clone of it.
``outboxkit_database_url`` / ``outboxkit_engine`` (test)
    A fresh clone for this test (``postgresql+psycopg://`` URL) and an engine
    on it; the database is dropped after the test.
``outboxkit_outboxes`` (session)
    The outbox classes of the kit: by default every ``Outbox`` subclass
    mapped to a table of your metadata.
``outboxkit_clock`` (test)
    A ``ManualClock`` at the wall clock's time.
``outboxkit_transport`` (test)
    A ``RecordingTransport`` answering 200; override it for strict mode or to
    forward to an ``HttpTransport`` under respx.  After the test it raises
    ``UnexpectedSendError`` for any unexpected send nobody reported.
``outboxkit_settings`` (test)
    The environment's ``OutboxKitSettings`` with ``drain_enabled``,
    ``scheduler_enabled`` and ``schedules_enabled`` off: a lifespan given the
    kit (``TestClient(app)``) starts no drain loop, no election and no
    schedule loop, so nothing sends or runs in the background,
    ``drain_until_idle`` delivers every row and ``kit.schedules.run_pending()``
    fires the due schedules when the test says so.
``outboxkit_kit`` (test)
    An ``OutboxKit`` on this test's database with those settings, that clock
    and that transport (attached, so sends are recorded per outbox).  It
    stays open for the whole test (its scheduler is not started) and is
    closed after it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence

import psycopg
import pytest
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.engine import make_url

from outboxkit.clock import ManualClock
from outboxkit.errors import InvalidTypeError, InvalidValueError
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.settings import OutboxKitSettings
from outboxkit.storage.notify import install_trigger_sql
from outboxkit.storage.tables import kit_metadata
from outboxkit.testing import RecordingTransport
from outboxkit.transports.base import Transport

__all__ = ["TemplateDatabase", "check_prefix", "outboxes_of"]

SERVER_URL_VARIABLE = "OUTBOXKIT_TEST_DATABASE_URL"
PREFIX_VARIABLE = "OUTBOXKIT_TEST_DATABASE_PREFIX"
PREFIX_INI_OPTION = "outboxkit_database_prefix"
DEFAULT_PREFIX = "outboxkit_test"
# A prefix, then "_<pid>_<6 hex>_<n>" or "_template": PostgreSQL keeps 63 bytes of a name.
_PREFIX_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,29}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(PREFIX_INI_OPTION, f"how outboxkit's test database names start (default {DEFAULT_PREFIX})", default=None)


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a safe start of a database name; otherwise ``InvalidValueError`` saying what is allowed."""
    if not _PREFIX_PATTERN.fullmatch(prefix):
        raise InvalidValueError(
            f"the test database prefix {prefix!r} is not allowed: use 1 to 30 lower-case letters, digits and _, "
            f"starting with a letter or _ (set {PREFIX_VARIABLE} or the ini option {PREFIX_INI_OPTION})"
        )
    return prefix


def outboxes_of(metadatas: Sequence[MetaData]) -> list[type[Outbox]]:
    """Every mapped ``Outbox`` subclass whose table is in one of ``metadatas``, by table name."""
    tables = {table for metadata in metadatas for table in metadata.tables.values()}
    found: list[type[Outbox]] = []
    pending = list(Outbox.__subclasses__())
    while pending:
        candidate = pending.pop()
        pending.extend(candidate.__subclasses__())
        if getattr(candidate, "__table__", None) in tables and candidate not in found:
            found.append(candidate)
    return sorted(found, key=lambda outbox: outbox.__tablename__)  # type: ignore[attr-defined]


class TemplateDatabase:
    """A database built once with the schema, cloned per test with ``CREATE DATABASE ... TEMPLATE``.

    Cloning copies the schema (and any rows the template holds) in a few
    milliseconds and isolates tests completely: advisory locks and NOTIFY
    channels are per database too.
    """

    def __init__(
        self, server_url: str, create_schema: Callable[[Engine], None], *, prefix: str = DEFAULT_PREFIX
    ) -> None:
        self.server_url = _libpq_url(server_url)
        self.prefix = f"{check_prefix(prefix)}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.template = f"{self.prefix}_template"
        self._count = 0
        self._execute(f'CREATE DATABASE "{self.template}"')
        engine = create_engine(self._sqlalchemy_url(self.template))
        try:
            create_schema(engine)
        except BaseException:
            engine.dispose()
            self.close()
            raise
        engine.dispose()  # a template with open connections cannot be cloned

    def create(self) -> str:
        """A fresh clone; returns its ``postgresql+psycopg://`` URL."""
        return self._create(f' TEMPLATE "{self.template}"')

    def create_empty(self) -> str:
        """A fresh database without the schema, for a test that runs its own migrations; ``drop`` it the same way."""
        return self._create("")

    def _create(self, template_clause: str) -> str:
        self._count += 1
        name = f"{self.prefix}_{self._count}"
        self._execute(f'CREATE DATABASE "{name}"{template_clause}')
        return self._sqlalchemy_url(name)

    def drop(self, url: str) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')

    def close(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')

    def _sqlalchemy_url(self, database: str) -> str:
        url = make_url(self.server_url).set(drivername="postgresql+psycopg", database=database)
        return url.render_as_string(hide_password=False)

    def _execute(self, statement: str) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as connection:
            connection.execute(statement)


def _libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _metadatas(metadata: MetaData | Sequence[MetaData]) -> list[MetaData]:
    metadatas = [metadata] if isinstance(metadata, MetaData) else list(metadata)
    if not metadatas or not all(isinstance(each, MetaData) for each in metadatas):
        raise InvalidTypeError(f"outboxkit_metadata must return a MetaData or a list of them, got {metadata!r}")
    return metadatas


@pytest.fixture(scope="session")
def outboxkit_server_url() -> str:
    """The server the test databases are created on, from ``OUTBOXKIT_TEST_DATABASE_URL``."""
    url = os.environ.get(SERVER_URL_VARIABLE)
    if not url:
        pytest.fail(
            f"outboxkit's fixtures need a PostgreSQL server: set {SERVER_URL_VARIABLE}="
            "postgresql://user@127.0.0.1:5432/postgres (a role allowed to CREATE DATABASE), "
            "or override the session fixture outboxkit_server_url in your conftest.py",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def outboxkit_database_prefix(pytestconfig: pytest.Config) -> str:
    """How the test databases' names start: ``OUTBOXKIT_TEST_DATABASE_PREFIX``, the ini option, or ``outboxkit_test``."""
    prefix = os.environ.get(PREFIX_VARIABLE) or pytestconfig.getini(PREFIX_INI_OPTION) or DEFAULT_PREFIX
    try:
        return check_prefix(str(prefix))
    except InvalidValueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def outboxkit_metadata() -> MetaData | Sequence[MetaData]:
    """Your models' metadata.  Override this fixture."""
    pytest.fail(
        "outboxkit's fixtures need your models: add to your conftest.py\n\n"
        "    @pytest.fixture(scope='session')\n"
        "    def outboxkit_metadata():\n"
        "        return Base.metadata\n",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def outboxkit_outboxes(outboxkit_metadata: MetaData | Sequence[MetaData]) -> list[type[Outbox]]:
    """The kit's outboxes: every Outbox subclass mapped in ``outboxkit_metadata``."""
    outboxes = outboxes_of(_metadatas(outboxkit_metadata))
    if not outboxes:
        pytest.fail("no Outbox subclass is mapped in outboxkit_metadata; override outboxkit_outboxes", pytrace=False)
    return outboxes


@pytest.fixture(scope="session")
def outboxkit_create_schema(
    outboxkit_metadata: MetaData | Sequence[MetaData], outboxkit_outboxes: list[type[Outbox]]
) -> Callable[[Engine], None]:
    """``create_schema(engine)``: your tables, the kit's tables and each outbox's NOTIFY trigger."""
    metadatas = _metadatas(outboxkit_metadata)

    def create_schema(engine: Engine) -> None:
        for metadata in [*metadatas, kit_metadata]:
            metadata.create_all(engine)
        with engine.begin() as connection:
            for outbox in outboxkit_outboxes:
                for statement in install_trigger_sql(outbox):
                    connection.exec_driver_sql(statement)

    return create_schema


@pytest.fixture(scope="session")
def outboxkit_template(
    outboxkit_database_prefix: str, outboxkit_server_url: str, outboxkit_create_schema: Callable[[Engine], None]
) -> Iterator[TemplateDatabase]:
    """The migrated template database, built once per session and dropped at its end."""
    template = TemplateDatabase(outboxkit_server_url, outboxkit_create_schema, prefix=outboxkit_database_prefix)
    yield template
    template.close()


@pytest.fixture
def outboxkit_database_url(outboxkit_template: TemplateDatabase) -> Iterator[str]:
    """A ``postgresql+psycopg://`` URL of this test's own database, dropped after the test."""
    url = outboxkit_template.create()
    yield url
    outboxkit_template.drop(url)


@pytest.fixture
def outboxkit_engine(outboxkit_database_url: str) -> Iterator[Engine]:
    """An engine on this test's database; it pings a pooled connection before handing it out (a test may restart
    or terminate the server's sessions)."""
    engine = create_engine(outboxkit_database_url, pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
def outboxkit_clock() -> ManualClock:
    """The kit's clock; it moves only when told to (``drain_until_idle`` moves it through backoff)."""
    return ManualClock()


@pytest.fixture
def outboxkit_transport() -> Iterator[RecordingTransport]:
    """The kit's transport; after the test, unexpected sends nobody reported fail it."""
    transport = RecordingTransport()
    yield transport
    transport.close()
    transport.check()


@pytest.fixture
def outboxkit_settings() -> OutboxKitSettings:
    """The environment's settings with the background work off: no drain loops, no election, no schedule loop."""
    return OutboxKitSettings.from_environment().model_copy(
        update={"drain_enabled": False, "scheduler_enabled": False, "schedules_enabled": False}
    )


@pytest.fixture
def outboxkit_kit(
    outboxkit_engine: Engine,
    outboxkit_outboxes: list[type[Outbox]],
    outboxkit_settings: OutboxKitSettings,
    outboxkit_clock: ManualClock,
    outboxkit_transport: Transport,
) -> Iterator[OutboxKit]:
    """A kit on this test's database: manual clock, recording transport attached, open until the test ends."""
    kit = OutboxKit(
        outboxkit_engine,
        outboxes=outboxkit_outboxes,
        settings=outboxkit_settings,
        clock=outboxkit_clock,
        transport=outboxkit_transport,
    )
    if isinstance(outboxkit_transport, RecordingTransport):
        outboxkit_transport.attach(kit)
    yield kit
    kit.close()
