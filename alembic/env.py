"""Alembic environment for the example service and outboxkit's own branch.

The database comes from ``-x url=...`` or, failing that, ``DATABASE_URL``; a
plain ``postgresql://`` URL is given the psycopg 3 driver.  Autogenerate
compares against the example's models plus outboxkit's tables, and only
those tables: anything else in the database is not this service's to drop.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from exampleapp.models import Base
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import make_url

from alembic import context
from outboxkit.storage.tables import kit_metadata

TARGET_METADATA = [Base.metadata, kit_metadata]
OWNED_TABLES = frozenset(name for metadata in TARGET_METADATA for name in metadata.tables)
# Drivers that name PostgreSQL without saying which Python driver to use.
BARE_POSTGRES_DRIVERS = ("postgres", "postgresql")


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit(
            "no database given: set DATABASE_URL or pass -x url=postgresql://user@host/database"
        )
    parsed = make_url(url)
    if parsed.drivername in BARE_POSTGRES_DRIVERS:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def include_name(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
    """Reflect only the tables this service owns (the version table is handled by Alembic)."""
    if type_ == "table":
        return name in OWNED_TABLES
    return True


def configure_options() -> dict[str, object]:
    return {
        "target_metadata": TARGET_METADATA,
        "compare_type": True,
        "include_name": include_name,
    }


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade heads --sql``) without connecting."""
    context.configure(url=database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"}, **configure_options())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, **configure_options())
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


config = context.config
# Programmatic callers (the tests) set configure_logging=False so that
# running a migration does not replace their logging setup.
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
