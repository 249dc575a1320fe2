"""A missing table or column becomes one line naming it and the migration to run, said once.

The errors are real: each test breaks the schema of its own database and
runs a query the kit runs, then hands the exception to the diagnostics.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import DBAPIError

from outboxkit.storage.diagnostics import MIGRATION_HINT, SchemaProblemLog, describe_database_error
from outboxkit.storage.tables import job_runs
from tests.support.database import libpq_url
from tests.support.models import SampleBase, SampleEvent


def error_of(engine: Engine, statement) -> DBAPIError:
    with engine.connect() as connection, pytest.raises(DBAPIError) as raised:
        connection.execute(statement)
    return raised.value


@pytest.fixture
def no_outbox_table(engine: Engine) -> Engine:
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE sample_event_outbox"))
    return engine


def test_a_missing_outbox_table_is_named_with_the_migration_to_run(no_outbox_table):
    error = error_of(no_outbox_table, select(SampleEvent).with_for_update(skip_locked=True))
    message = describe_database_error(error, SampleEvent)
    assert message == (
        "sample-events: the outbox table sample_event_outbox (SampleEvent) does not exist: generate your "
        "application's migration for it (`alembic revision --autogenerate -m 'outbox tables'`, "
        "docs/getting-started.md) and run `alembic upgrade heads`"
    )
    assert "SELECT" not in message and "\n" not in message


def test_without_an_outbox_the_missing_table_is_still_named(no_outbox_table):
    message = describe_database_error(error_of(no_outbox_table, select(SampleEvent)))
    assert message == f'a table is missing (relation "sample_event_outbox" does not exist): {MIGRATION_HINT}'


def test_a_missing_kit_table_points_at_the_kits_migration_branch(engine):
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE outboxkit_job_runs"))
    message = describe_database_error(error_of(engine, select(job_runs)), SampleEvent)
    assert message == f"sample-events: outboxkit's table outboxkit_job_runs does not exist: {MIGRATION_HINT}"
    assert "outboxkit:migrations/versions" in message


def test_a_missing_column_says_the_table_is_older_than_the_model(engine):
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE sample_event_outbox DROP COLUMN claim_token"))
    message = describe_database_error(error_of(engine, select(SampleEvent)), SampleEvent)
    assert message is not None
    assert message.startswith("sample-events: a column is missing in sample_event_outbox (column ")
    assert "claim_token does not exist): the table is older than the model" in message
    assert "alembic revision --autogenerate" in message


def test_the_psycopg_error_itself_is_recognised(no_outbox_table, database_url):
    with psycopg.connect(libpq_url(database_url)) as connection, pytest.raises(psycopg.Error) as raised:
        connection.execute("SELECT 1 FROM sample_event_outbox")
    assert "the outbox table sample_event_outbox (SampleEvent) does not exist" in describe_database_error(
        raised.value, SampleEvent
    )


@pytest.mark.parametrize("statement", ["SELECT 1 / 0", "SELECT * FROM sample_event_outbox WHERE id = 'x'"])
def test_other_database_errors_are_not_described(engine, statement):
    assert describe_database_error(error_of(engine, text(statement)), SampleEvent) is None


def test_a_schema_problem_is_said_once_then_quietly_until_it_is_fixed(no_outbox_table, caplog):
    logger = logging.getLogger("outboxkit.tests.diagnostics")
    problems = SchemaProblemLog(logger)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    claim = select(SampleEvent).with_for_update(skip_locked=True)

    for _ in range(3):  # three drains in a row meet the missing table
        assert problems.report(error_of(no_outbox_table, claim), SampleEvent) is not None
    said = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [level for level, _ in said] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert said[0][1].startswith("sample-events: the outbox table sample_event_outbox (SampleEvent) does not exist")
    assert said[0][1].endswith("(said once; repeats are logged at DEBUG until it is fixed)")
    assert not any("SELECT" in message for _, message in said)

    caplog.clear()
    SampleBase.metadata.create_all(no_outbox_table)  # the migration ran
    with no_outbox_table.connect() as connection:
        connection.execute(claim).all()
    problems.clear()
    problems.clear()  # a second healthy drain says nothing more
    assert [(record.levelno, record.getMessage().split(":")[0]) for record in caplog.records] == [
        (logging.INFO, "fixed now")
    ]

    caplog.clear()
    with no_outbox_table.begin() as connection:
        connection.execute(text("DROP TABLE sample_event_outbox"))
    problems.report(error_of(no_outbox_table, claim), SampleEvent)
    assert [record.levelno for record in caplog.records] == [logging.ERROR]  # broken again: said again


def test_an_error_that_is_not_a_schema_problem_is_left_to_the_caller(engine, caplog):
    problems = SchemaProblemLog(logging.getLogger("outboxkit.tests.diagnostics"))
    caplog.set_level(logging.DEBUG)
    assert problems.report(error_of(engine, text("SELECT 1 / 0")), SampleEvent) is None
    assert caplog.records == []
