"""The example service's migrations (alembic/) build exactly the schema its models describe.

``alembic upgrade heads`` runs both branches: the example's tables
(``exampleapp``, in alembic/versions) and outboxkit's own tables
(``outboxkit``, shipped in the package and found through
``outboxkit:migrations/versions``).  Then autogenerate must see no
difference, and the catalog of the migrated database must equal that of a
database made by ``create_all`` from the same models.
"""

from __future__ import annotations

import argparse
import io
import sys
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from exampleapp.models import Base as ExampleBase
from sqlalchemy import Column, Connection, Engine, MetaData, Text, create_engine, text

import outboxkit.migrations
from alembic import command
from outboxkit.storage.tables import kit_metadata
from tests.support.database import DatabaseFactory, sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = ROOT / "alembic" / "alembic.ini"
TARGET_METADATA = [ExampleBase.metadata, kit_metadata]
OWNED_TABLES = sorted(name for metadata in TARGET_METADATA for name in metadata.tables)
HEADS = {"example_0005", "outboxkit_0021"}


def alembic_config(url: str | None) -> Config:
    """A Config on alembic/alembic.ini, as ``alembic -x url=<url>`` would build it."""
    arguments = [f"url={url}"] if url else []
    config = Config(str(ALEMBIC_INI), cmd_opts=argparse.Namespace(x=arguments), stdout=io.StringIO())
    config.attributes["configure_logging"] = False  # keep pytest's logging setup
    return config


def run_alembic(url: str | None, action: str, *arguments: str) -> str:
    """Run ``alembic -x url=<url> <action> <arguments>``; return what Alembic printed."""
    config = alembic_config(url)
    saved_path = list(sys.path)  # env.py's prepend_sys_path must not pile up across tests
    try:
        getattr(command, action)(config, *arguments)
    finally:
        sys.path[:] = saved_path
    return config.stdout.getvalue()


def differences(connection: Connection, metadata: MetaData | list[MetaData]) -> list:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return compare_metadata(context, metadata)


def catalog(connection: Connection) -> dict[str, object]:
    """Columns, constraints, indexes and triggers of the owned tables, as PostgreSQL prints them."""
    tables = {"tables": OWNED_TABLES}
    columns = connection.execute(
        text(
            "SELECT table_name, column_name, data_type, character_maximum_length, is_nullable, "
            "column_default, is_identity, identity_generation "
            "FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ANY(:tables) "
            "ORDER BY table_name, column_name"
        ),
        tables,
    ).all()
    constraints = connection.execute(
        text(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid::regclass::text = ANY(:tables) ORDER BY 1, 2"
        ),
        tables,
    ).all()
    indexes = connection.execute(
        text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = ANY(:tables) ORDER BY 1"),
        tables,
    ).all()
    triggers = connection.execute(
        text(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE NOT tgisinternal AND tgrelid::regclass::text = ANY(:tables) ORDER BY 1"
        ),
        tables,
    ).all()
    return {"columns": columns, "constraints": constraints, "indexes": indexes, "triggers": triggers}


@pytest.fixture(scope="module")
def migrated(database_factory: DatabaseFactory) -> Iterator[Engine]:
    """One empty database taken to ``heads`` and shared by the read-only checks below."""
    url = database_factory.create_empty()
    engine = create_engine(sqlalchemy_url(url), pool_size=2, max_overflow=0)
    try:
        run_alembic(url, "upgrade", "heads")
        yield engine
    finally:
        engine.dispose()
        database_factory.drop(url)


@pytest.fixture
def empty_database_url(database_factory: DatabaseFactory) -> Iterator[str]:
    url = database_factory.create_empty()
    yield url
    database_factory.discard(url)


# -- the migration environment ---------------------------------------------------


def test_both_branches_are_found_including_the_package_path_form():
    script = ScriptDirectory.from_config(alembic_config(None))
    assert set(script.get_heads()) == HEADS
    kit_revision = script.get_revision("outboxkit@head")
    assert kit_revision.revision == "outboxkit_0021"
    assert Path(kit_revision.path).parent == outboxkit.migrations.VERSIONS
    assert Path(script.get_revision("exampleapp@head").path).parent == ROOT / "alembic" / "versions"


def test_the_wheel_would_ship_the_kit_migrations():
    # The versions folder has no __init__.py: it ships because setuptools'
    # pyproject discovery finds namespace packages (namespaces = true is the
    # default) whose dotted name the include patterns match.  A wheel built
    # from this pyproject lists outboxkit/migrations/versions/*.py.
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    package = "outboxkit.migrations.versions"
    assert find.get("namespaces", True) is True
    assert any(fnmatchcase(package, pattern) for pattern in find["include"])
    assert not any(fnmatchcase(package, pattern) for pattern in find.get("exclude", ()))
    assert list(outboxkit.migrations.VERSIONS.glob("outboxkit_*.py"))


# -- upgrade heads ---------------------------------------------------------------


def test_upgrade_heads_records_both_heads(migrated):
    with migrated.connect() as connection:
        versions = set(connection.execute(text("SELECT version_num FROM alembic_version")).scalars())
    assert versions == HEADS


def test_autogenerate_finds_no_difference_after_upgrade_heads(migrated):
    with migrated.connect() as connection:
        assert differences(connection, TARGET_METADATA) == []


def test_the_comparison_notices_a_model_that_diverges(migrated):
    diverged = MetaData()
    for metadata in TARGET_METADATA:
        for table in metadata.tables.values():
            table.to_metadata(diverged)
    diverged.tables["credit_grant_outbox"].append_column(Column("currency", Text, nullable=True))
    due_index = next(index for index in diverged.tables["webhook_outbox"].indexes if index.name == "ix_webhook_outbox_due_id")
    diverged.tables["webhook_outbox"].indexes.remove(due_index)
    with migrated.connect() as connection:
        found = differences(connection, diverged)
    kinds = sorted((difference[0], getattr(difference[-1], "name", None)) for difference in found)
    assert kinds == [("add_column", "currency"), ("remove_index", "ix_webhook_outbox_due_id")]


def test_the_migrated_catalog_equals_create_all(migrated, engine):
    # compare_metadata does not look at server defaults, partial-index WHERE
    # clauses or CHECK bodies; the catalogs of the two databases do.
    with migrated.connect() as from_migrations, engine.connect() as from_models:
        migrated_catalog = catalog(from_migrations)
        modelled_catalog = catalog(from_models)
    assert migrated_catalog == modelled_catalog
    indexes = dict(migrated_catalog["indexes"])
    for table in ("credit_grant_outbox", "webhook_outbox"):
        assert indexes[f"ix_{table}_due_id"].endswith("(next_attempt_at, id) WHERE ((status)::text = 'pending'::text)")
        assert indexes[f"ix_{table}_claimed"].endswith("(claimed_until) WHERE (claimed_until IS NOT NULL)")
        assert f"ix_{table}_due" not in indexes


def test_alembic_check_through_env_py_passes(migrated):
    url = migrated.url.render_as_string(hide_password=False)
    output = run_alembic(url, "check")  # raises AutogenerateDiffsDetected on any difference
    assert "No new upgrade operations detected" in output


# -- upgrading an existing table to the (next_attempt_at, id) due index ----------


def database_at(url: str, revision: str) -> Iterator[tuple[str, Engine]]:
    """The database at ``url`` as an existing user has it: the example's branch at ``revision``, the kit's at its head."""
    run_alembic(url, "upgrade", revision)
    run_alembic(url, "upgrade", "outboxkit@head")
    engine = create_engine(sqlalchemy_url(url), pool_size=1, max_overflow=0)
    yield url, engine
    engine.dispose()


@pytest.fixture
def before_the_due_index_change(empty_database_url: str) -> Iterator[tuple[str, Engine]]:
    """Built before the mixin's due index took ``id``: example_0002 is the last revision with ``ix_<table>_due``."""
    yield from database_at(empty_database_url, "example_0002")


def test_autogenerate_on_a_table_with_the_old_due_index_proposes_drop_old_and_create_new(before_the_due_index_change):
    _, engine = before_the_due_index_change
    with engine.connect() as connection:
        found = differences(connection, TARGET_METADATA)
    changes = sorted(
        (change[0], change[1].table.name, change[1].name, tuple(column.name for column in change[1].columns))
        for change in found if change[0] in ("add_index", "remove_index")
    )
    expected = []
    for table in ("credit_grant_outbox", "webhook_outbox"):
        expected += [
            ("add_index", table, f"ix_{table}_claimed", ("claimed_until",)),
            ("add_index", table, f"ix_{table}_due_id", ("next_attempt_at", "id")),
            ("add_index", table, f"ix_{table}_destination_due", ("destination", "next_attempt_at", "id")),
            ("add_index", table, f"ix_{table}_discarded", ("id",)),
            ("remove_index", table, f"ix_{table}_due", ("next_attempt_at",)),
        ]
    assert changes == sorted(expected)


# -- upgrading an existing table to rows that carry their destination ----------------


@pytest.fixture
def before_the_destination_column(empty_database_url: str) -> Iterator[tuple[str, Engine]]:
    """Built before the mixin's ``destination`` column: example_0003 is the last revision without it."""
    yield from database_at(empty_database_url, "example_0003")


def test_autogenerate_on_a_table_without_the_destination_proposes_the_column_and_its_index(before_the_destination_column):
    _, engine = before_the_destination_column
    with engine.connect() as connection:
        found = differences(connection, TARGET_METADATA)
    changes = sorted(
        (change[0], change[3].name) if change[0] == "add_column" else (change[0], change[1].name) for change in found
    )
    assert changes == sorted(
        [("add_column", "destination")] * 2
        + [("add_index", f"ix_{table}_destination_due") for table in ("credit_grant_outbox", "webhook_outbox")]
        + [("add_index", f"ix_{table}_discarded") for table in ("credit_grant_outbox", "webhook_outbox")]
    )


# -- upgrading an existing table to rows that may be discarded ---------------------


@pytest.fixture
def before_discarded_rows(empty_database_url: str) -> Iterator[tuple[str, Engine]]:
    """Built before the ``discarded`` status: example_0004 is the last revision without it."""
    yield from database_at(empty_database_url, "example_0004")


def test_allow_discarded_lets_a_table_take_the_status_and_forbid_discarded_undoes_it(before_discarded_rows):
    url, engine = before_discarded_rows
    with engine.connect() as connection:  # autogenerate sees the index only: the CHECK needs allow_discarded
        assert [(change[0], change[1].name) for change in differences(connection, TARGET_METADATA)] == [
            ("add_index", f"ix_{table}_discarded") for table in ("credit_grant_outbox", "webhook_outbox")
        ]
    discard = text(
        "INSERT INTO webhook_outbox (event, target_url, payload, status) VALUES ('e', 'https://h.example/', '{}', 'discarded')"
    )
    with pytest.raises(Exception, match="ck_webhook_outbox_status"), engine.begin() as connection:
        connection.execute(discard)
    run_alembic(url, "upgrade", "heads")
    with engine.begin() as connection:
        assert differences(connection, TARGET_METADATA) == []
        connection.execute(discard)
        connection.execute(text("DELETE FROM webhook_outbox"))
    run_alembic(url, "downgrade", "example_0004")
    with pytest.raises(Exception, match="ck_webhook_outbox_status"), engine.begin() as connection:
        connection.execute(discard)


def test_the_destination_migration_backfills_pending_rows_only(before_the_destination_column):
    url, engine = before_the_destination_column
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO webhook_outbox (event, target_url, payload, status) "
                "SELECT 'e', 'https://hooks.example.com:8443/in/' || n, '{}', "
                "CASE WHEN n <= 3 THEN 'pending' ELSE 'done' END FROM generate_series(1, 5) AS n"
            )
        )
    run_alembic(url, "upgrade", "heads")
    with engine.connect() as connection:
        assert differences(connection, TARGET_METADATA) == []
        found = connection.execute(text("SELECT status, destination FROM webhook_outbox ORDER BY id")).all()
    assert found == [("pending", "https://hooks.example.com:8443")] * 3 + [("done", None)] * 2
    run_alembic(url, "downgrade", "example_0003")
    with engine.connect() as connection:
        columns = connection.execute(
            text("SELECT column_name FROM information_schema.columns WHERE table_name = 'webhook_outbox'")
        ).scalars().all()
    assert "destination" not in columns


def test_the_index_migration_upgrades_and_downgrades_a_table_with_rows(before_the_due_index_change):
    url, engine = before_the_due_index_change
    index_names = text("SELECT indexname FROM pg_indexes WHERE tablename = 'webhook_outbox' ORDER BY 1")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO webhook_outbox (event, target_url, payload) "
                "SELECT 'e', 'http://127.0.0.1:9/', '{}' FROM generate_series(1, 100)"
            )
        )
    run_alembic(url, "upgrade", "heads")  # CREATE INDEX CONCURRENTLY: in Alembic's autocommit block
    with engine.connect() as connection:
        assert differences(connection, TARGET_METADATA) == []
        assert "ix_webhook_outbox_due_id" in connection.execute(index_names).scalars().all()
        valid = connection.execute(
            text("SELECT bool_and(indisvalid) FROM pg_index WHERE indrelid = 'webhook_outbox'::regclass")
        ).scalar_one()
        assert valid is True
        assert connection.execute(text("SELECT count(*) FROM webhook_outbox")).scalar_one() == 100
    run_alembic(url, "downgrade", "example_0002")
    with engine.connect() as connection:
        names = connection.execute(index_names).scalars().all()
    assert "ix_webhook_outbox_due" in names
    assert "ix_webhook_outbox_due_id" not in names and "ix_webhook_outbox_claimed" not in names


# -- round trip and URL handling -------------------------------------------------


def test_downgrade_base_removes_everything_and_upgrade_works_again(empty_database_url):
    run_alembic(empty_database_url, "upgrade", "heads")
    run_alembic(empty_database_url, "downgrade", "base")
    engine = create_engine(sqlalchemy_url(empty_database_url), pool_size=1, max_overflow=0)
    try:
        with engine.connect() as connection:
            tables = set(connection.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
            assert tables == {"alembic_version"}
            assert connection.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 0
        run_alembic(empty_database_url, "upgrade", "heads")
        with engine.connect() as connection:
            assert differences(connection, TARGET_METADATA) == []
    finally:
        engine.dispose()


def test_env_py_leaves_tables_it_does_not_own_alone(migrated):
    url = migrated.url.render_as_string(hide_password=False)
    with migrated.begin() as connection:
        connection.execute(text("CREATE TABLE someone_elses_table (id integer PRIMARY KEY)"))
    try:
        # Without env.py's include_name this would report remove_table and raise.
        assert "No new upgrade operations detected" in run_alembic(url, "check")
    finally:
        with migrated.begin() as connection:
            connection.execute(text("DROP TABLE someone_elses_table"))


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_database_url_from_the_environment_is_used(migrated, monkeypatch, scheme):
    bare_url = migrated.url.set(drivername=scheme).render_as_string(hide_password=False)
    monkeypatch.setenv("DATABASE_URL", bare_url)  # env.py adds the psycopg 3 driver
    assert sorted(run_alembic(None, "current").split()) == ["(head)", "(head)", "example_0005", "outboxkit_0021"]


def test_a_missing_url_is_refused_with_a_hint(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SystemExit, match="set DATABASE_URL or pass -x url="):
        run_alembic(None, "upgrade", "heads")


def test_the_subscription_destination_migration_renames_subscriptions_and_their_undelivered_rows(empty_database_url):
    run_alembic(empty_database_url, "upgrade", "outboxkit_0014")
    engine = create_engine(sqlalchemy_url(empty_database_url), pool_size=1, max_overflow=0)
    try:
        with engine.begin() as connection:
            number = connection.execute(text(
                "INSERT INTO outboxkit_subscriptions (url, destination, event_types, secrets, created_by, changed_by) "
                "VALUES ('https://hooks.example.com/in', 'https://hooks.example.com:443', ARRAY['a.b'], ARRAY['s'], 'm', 'm') "
                "RETURNING id")).scalar_one()
            connection.execute(text(
                "INSERT INTO outboxkit_event_deliveries "
                "(event_id, subscription_id, event_type, url, destination, headers, body, status) "
                "SELECT 1, :id, 'a.b', 'https://hooks.example.com/in', 'https://hooks.example.com:443', '{}', '{}', s "
                "FROM unnest(ARRAY['pending', 'stuck', 'done']) AS s"), {"id": number})
        run_alembic(empty_database_url, "upgrade", "heads")
        own = f"subscription {number}: https://hooks.example.com:443"
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT destination FROM outboxkit_subscriptions")) == own
            rows = connection.execute(text("SELECT status, destination FROM outboxkit_event_deliveries ORDER BY id")).all()
        assert [tuple(row) for row in rows] == [
            ("pending", own), ("stuck", own), ("done", "https://hooks.example.com:443")]
        run_alembic(empty_database_url, "downgrade", "outboxkit_0014")
        with engine.connect() as connection:
            destinations = connection.execute(text(
                "SELECT destination FROM outboxkit_subscriptions UNION SELECT destination FROM outboxkit_event_deliveries"
            )).scalars().all()
        assert destinations == ["https://hooks.example.com:443"]
    finally:
        engine.dispose()
