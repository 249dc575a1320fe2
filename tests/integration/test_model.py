"""The outbox schema in PostgreSQL: server defaults, constraints, the partial indexes and the plans that use them.

The options and class checks, which need no database, are in tests/unit/test_model.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from exampleapp.models import CreditGrantOutbox, WebhookOutbox
from sqlalchemy import Engine, create_engine, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from outboxkit.storage.operator_queries import STATUS_COUNTS
from tests.support.database import DatabaseFactory, sqlalchemy_url
from tests.support.models import SampleEvent

# -- the schema in PostgreSQL ----------------------------------------------------


@pytest.fixture(scope="module")
def schema_engine(database_factory: DatabaseFactory) -> Iterator[Engine]:
    """One database for this module's schema checks: creating one per test costs more than they do."""
    url = database_factory.create()
    engine = create_engine(sqlalchemy_url(url), pool_size=2, max_overflow=0)
    yield engine
    engine.dispose()
    database_factory.drop(url)


@pytest.fixture
def outbox_engine(schema_engine: Engine) -> Engine:
    """The module's database with an empty sample outbox."""
    with schema_engine.begin() as connection:
        connection.execute(text("TRUNCATE sample_event_outbox"))
    return schema_engine


def test_an_orm_insert_fills_the_delivery_defaults(outbox_engine):
    with Session(outbox_engine) as session, session.begin():
        rows = [SampleEvent(target_url="http://127.0.0.1:1/e", payload={"n": n}) for n in range(2)]
        session.add_all(rows)
    with Session(outbox_engine) as session:
        stored = session.scalars(select(SampleEvent).order_by(SampleEvent.id)).all()
        database_now = session.scalar(text("SELECT now()"))
    assert len({row.idempotency_key for row in stored}) == 2
    for row in stored:
        assert isinstance(row.idempotency_key, uuid.UUID)
        assert (row.status, row.attempts) == ("pending", 0)
        assert row.next_attempt_at is not None and row.next_attempt_at <= database_now
        assert row.created_at is not None and row.updated_at is not None
        assert (row.delivered_at, row.last_error, row.last_status_code) == (None, None, None)
        assert (row.claimed_until, row.claim_token) == (None, None)


def test_a_plain_sql_insert_gets_the_same_defaults_from_the_server(outbox_engine):
    with outbox_engine.begin() as connection:
        connection.execute(text("INSERT INTO sample_event_outbox (target_url, payload) VALUES ('http://127.0.0.1:1/e', '{}')"))
        connection.execute(insert(SampleEvent.__table__).values(target_url="http://127.0.0.1:1/f", payload={}))
        rows = connection.execute(
            text(
                "SELECT idempotency_key, status, attempts, next_attempt_at, now() AS database_now, kind "
                "FROM sample_event_outbox ORDER BY id"
            )
        ).all()
    assert len(rows) == 2
    assert rows[0].idempotency_key != rows[1].idempotency_key
    for row in rows:
        assert isinstance(row.idempotency_key, uuid.UUID)
        assert (row.status, row.attempts, row.kind) == ("pending", 0, "event")
        assert row.next_attempt_at == row.database_now  # both are the transaction's now()


def test_a_future_next_attempt_at_at_insert_is_kept(outbox_engine):
    later = datetime.fromisoformat("2031-06-01T09:00:00+00:00")
    with Session(outbox_engine) as session, session.begin():
        session.add(SampleEvent(target_url="http://127.0.0.1:1/e", payload={}, next_attempt_at=later))
    with Session(outbox_engine) as session:
        assert session.scalars(select(SampleEvent.next_attempt_at)).one() == later


@pytest.mark.parametrize("status", ["bogus", "PENDING"])
def test_the_check_constraint_rejects_an_unknown_status(outbox_engine, status):
    with Session(outbox_engine) as session, session.begin():
        session.add(SampleEvent(target_url="http://127.0.0.1:1/e", payload={}))
    with pytest.raises(IntegrityError, match="ck_sample_event_outbox_status"):
        with outbox_engine.begin() as connection:
            connection.execute(update(SampleEvent.__table__).values(status=status))
    with outbox_engine.connect() as connection:
        assert connection.scalar(text("SELECT status FROM sample_event_outbox")) == "pending"


def test_the_idempotency_key_is_unique(outbox_engine):
    key = uuid.uuid4()
    with Session(outbox_engine) as session, session.begin():
        session.add(SampleEvent(target_url="http://127.0.0.1:1/e", payload={}, idempotency_key=key))
    with pytest.raises(IntegrityError, match="uq_sample_event_outbox_idempotency_key"):
        with Session(outbox_engine) as session, session.begin():
            session.add(SampleEvent(target_url="http://127.0.0.1:1/e", payload={}, idempotency_key=key))


def test_the_partial_indexes_exist_on_every_outbox_table(outbox_engine):
    with outbox_engine.connect() as connection:
        definitions = dict(
            connection.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'")).all()
        )
    for table in (SampleEvent.__tablename__, CreditGrantOutbox.__tablename__, WebhookOutbox.__tablename__):
        due = definitions[f"ix_{table}_due_id"]
        assert f"ON public.{table} USING btree (next_attempt_at, id)" in due
        assert due.endswith("WHERE ((status)::text = 'pending'::text)")
        assert f"ix_{table}_due" not in definitions
        assert definitions[f"ix_{table}_stuck"].endswith("USING btree (id) WHERE ((status)::text = 'stuck'::text)")
        assert definitions[f"ix_{table}_claimed"].endswith("USING btree (claimed_until) WHERE (claimed_until IS NOT NULL)")


def plan_nodes(plan: dict, ancestors: tuple[dict, ...] = ()) -> Iterator[tuple[dict, tuple[dict, ...]]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan with the nodes above it."""
    yield plan, ancestors
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child, (*ancestors, plan))


def test_the_claim_reads_one_batch_of_index_entries_when_every_row_shares_one_due_time(outbox_engine):
    # One INSERT ... SELECT gives every row the same now(): the shape of a
    # bulk enqueue or a bulk reset.  With the due index on next_attempt_at
    # alone, the claim read and sorted all 20,000 of them.
    from outboxkit.storage.drain_queries import claim_sql, rate_parameters

    with outbox_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sample_event_outbox (target_url, payload) "
                "SELECT 'http://127.0.0.1:1/e', '{}' FROM generate_series(1, 20000)"
            )
        )
        connection.execute(text("ANALYZE sample_event_outbox"))
    claim = claim_sql("sample_event_outbox", synchronous_commit=True)
    parameters = {
        "now": datetime(2100, 1, 1, tzinfo=timezone.utc),
        "lease_until": datetime(2100, 1, 1, 0, 1, tzinfo=timezone.utc),
    }
    parameters.update(limit=50, token=uuid.uuid4(), outbox="sample-events", after=None, cap=8, unknown_suspect=True,
                      steps=200, probes=1, **rate_parameters(None))
    connection = outbox_engine.connect()
    try:  # EXPLAIN ANALYZE runs the claim: roll it back
        plan = connection.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + claim), parameters).scalar_one()[0]["Plan"]
    finally:
        connection.rollback()
        connection.close()
    nodes = [node for node, _ in plan_nodes(plan)]
    scans = [node for node in nodes if node.get("Index Name") == "ix_sample_event_outbox_destination_due"]
    assert scans  # the claim walks the destination index
    assert max(node["Actual Rows"] * node.get("Actual Loops", 1) for node in nodes) <= 50  # one batch: no group read whole
    assert not [node for node in nodes if "Sort" in node["Node Type"] and node["Actual Rows"] > 50]
    assert plan["Actual Rows"] == 50


def test_the_overview_counts_read_only_partial_indexes(outbox_engine):
    from outboxkit.storage.operator_queries import admin_queries_for

    with outbox_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sample_event_outbox (target_url, payload, status, delivered_at) "
                "SELECT 'http://127.0.0.1:1/e', '{}', 'done', now() FROM generate_series(1, 20000)"
            )
        )
        connection.execute(  # a backlog, a few of it claimed
            text(
                "INSERT INTO sample_event_outbox (target_url, payload, next_attempt_at, claimed_until, claim_token) "
                "SELECT 'http://127.0.0.1:1/e', '{}', now() + g * interval '1 second', "
                "CASE WHEN g <= 10 THEN now() + interval '1 minute' END, CASE WHEN g <= 10 THEN gen_random_uuid() END "
                "FROM generate_series(1, 5000) AS g"
            )
        )
        connection.execute(text("ANALYZE sample_event_outbox"))
    queries = admin_queries_for(SampleEvent)
    with outbox_engine.connect() as connection:
        plan = connection.execute(
            text("EXPLAIN (FORMAT JSON) " + STATUS_COUNTS.format(table=queries.table_name, estimate="reltuples")),
            {
                "now": datetime(2030, 1, 1, tzinfo=timezone.utc),
                "cap": 100_001,
                "table_name": queries.table_name,
                "due_index": queries.due_index,
                "stuck_index": queries.stuck_index,
            },
        ).scalar_one()[0]["Plan"]
    nodes = [node for node, _ in plan_nodes(plan)]
    on_the_outbox = [node["Node Type"] for node in nodes if node.get("Relation Name") == "sample_event_outbox"]
    assert len(on_the_outbox) == 4 and "Seq Scan" not in on_the_outbox
    assert sorted(node["Index Name"] for node in nodes if node.get("Index Name", "").startswith("ix_")) == [
        "ix_sample_event_outbox_claimed",  # in flight
        "ix_sample_event_outbox_due_id",  # pending (capped)
        "ix_sample_event_outbox_due_id",  # oldest due
        "ix_sample_event_outbox_stuck",  # stuck (capped)
    ]
