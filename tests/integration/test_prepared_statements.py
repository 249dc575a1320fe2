"""Server-side prepared statements: none unless the operator opts in (OUTBOXKIT_PREPARED_STATEMENTS).

A transaction-mode pooler before PgBouncer 1.21 hands the next execution of
a prepared statement to a server connection that never saw the PREPARE, so
by default the kit prepares nothing: not its outcome write, not its attempt
history, not on an engine it builds, not on its lock and LISTEN connections.
Counted in ``pg_prepared_statements`` of every connection in the pool.
"""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit import OutboxKit, OutboxKitSettings
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent

POOL_SIZE = 4


# The outcome write (one row's, or a group's: the drain writes outcomes that finish together as one
# statement) and the attempt history insert, as PostgreSQL shows them once prepared.
OUTCOME_WRITE = "delivered_at = "
ATTEMPT_INSERT = "INSERT INTO outboxkit_attempts"


def prepared_in_pool(engine) -> list[str]:
    """The prepared statements on the connections of an engine's pool (``POOL_SIZE``, all checked out at once)."""
    connections = [engine.connect() for _ in range(POOL_SIZE)]
    try:
        query = text("SELECT statement FROM pg_prepared_statements")
        return [statement for connection in connections for statement in connection.execute(query).scalars()]
    finally:
        for connection in connections:
            connection.close()


def kit_statements(statements: list[str]) -> list[str]:
    return [statement for statement in statements if OUTCOME_WRITE in statement or ATTEMPT_INSERT in statement]


def drain_rows(
    database_url: str, receiver, insert_events, *, prepared_statements: bool, connect_args: dict | None = None
) -> list[str]:
    engine = create_engine(
        sqlalchemy_url(database_url), pool_size=POOL_SIZE, max_overflow=0, connect_args=connect_args or {}
    )
    settings = OutboxKitSettings(prepared_statements=prepared_statements, listen_enabled=False)
    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    try:
        insert_events([{"n": n} for n in range(30)])
        result = kit.drain(SampleEvent)
        assert result.delivered == 30
        # The drain's own pool (outboxkit.storage.drain_pool), built with the engine's connect_args; read first: a
        # rollback (a pool's reset) makes psycopg deallocate them all.
        prepared = prepared_in_pool(kit.drain_database.engine)
        with engine.connect() as connection:  # the attempt history was written too, on the same pool
            assert connection.execute(text("SELECT count(*) FROM outboxkit_attempts")).scalar_one() == 30
        return prepared
    finally:
        kit.close()
        engine.dispose()


def test_by_default_the_kit_prepares_no_statement_on_an_engine_built_for_a_transaction_pool(
    database_url, receiver, insert_events
):
    # The engine docs/operations.md asks for behind a transaction-mode pooler: psycopg prepares nothing by itself.
    assert OutboxKitSettings().prepared_statements is False
    options = {"prepared_statements": False, "connect_args": {"prepare_threshold": None}}
    assert drain_rows(database_url, receiver, insert_events, **options) == []


def test_by_default_the_kits_own_statements_are_not_prepared_even_where_psycopg_may_prepare(
    database_url, receiver, insert_events
):
    # A default engine (psycopg prepares a statement on its 5th run): the kit's own statements say
    # prepare=False, so at most what SQLAlchemy runs for it (the claim) is prepared there.
    assert kit_statements(drain_rows(database_url, receiver, insert_events, prepared_statements=False)) == []


def test_opted_in_on_a_direct_engine_the_outcome_write_and_the_history_insert_are_prepared(
    database_url, receiver, insert_events
):
    prepared = kit_statements(drain_rows(database_url, receiver, insert_events, prepared_statements=True))
    assert any(OUTCOME_WRITE in statement for statement in prepared), prepared
    assert any(ATTEMPT_INSERT in statement for statement in prepared), prepared


def test_an_engine_the_kit_builds_prepares_nothing_unless_opted_in(database_url):
    thresholds = {}
    for opted_in in (False, True):
        async_engine = create_async_engine(sqlalchemy_url(database_url))
        kit = OutboxKit(async_engine, [SampleEvent], settings=OutboxKitSettings(prepared_statements=opted_in))
        try:
            with kit.engine.connect() as connection:
                thresholds[opted_in] = connection.connection.driver_connection.prepare_threshold
        finally:
            kit.close()
            async_engine.sync_engine.dispose()
    assert thresholds == {False: None, True: 5}  # 5: psycopg's default


def test_the_lock_and_listen_connections_prepare_nothing(engine, database_url):
    for lock_url in (None, database_url):  # from the engine, and from OUTBOXKIT_LOCK_DATABASE_URL
        kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(lock_database_url=lock_url))
        try:
            connection = kit.session_connector("outboxkit-test")()
            try:
                assert connection.prepare_threshold is None
            finally:
                connection.close()
        finally:
            kit.close()
