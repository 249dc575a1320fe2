"""Change data capture: an outbox with Debezium's outbox-router columns, read from PostgreSQL's logical decoding.

Debezium itself does not run here; what it reads does.  A private cluster with ``wal_level=logical`` (the shared
server is never reconfigured) holds a ``relay="cdc"`` outbox; rows are written with ``capture`` in transactions
that commit or roll back, and a ``test_decoding`` replication slot shows the change stream a connector reads:
every committed row's insert, with the router's fields and the idempotency key, in commit order; nothing of a
rolled-back transaction; the table left empty.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Session

from outboxkit import OutboxOptions
from outboxkit.model import Outbox
from outboxkit.storage.debezium import DebeziumColumns, capture
from tests.faults.private_server import PrivateServer, postgres_binaries
from tests.support.database import sqlalchemy_url

SLOT = "outboxkit_cdc"
_FIELD = re.compile(r"(\w+)\[[^\]]+\]:('(?:[^']|'')*'|\S+)")


class CaptureBase(DeclarativeBase):
    pass


class OrderEvent(DebeziumColumns, Outbox, CaptureBase):
    __tablename__ = "order_events"
    __outbox__ = OutboxOptions(job_name="order-events", relay="cdc")


@pytest.fixture(scope="module")
def logical_server() -> Iterator[PrivateServer]:
    """A cluster of the module's own with ``wal_level=logical`` (its database ``postgres`` is the test's)."""
    binaries = postgres_binaries()
    if binaries is None:
        reason = "needs PostgreSQL's initdb and pg_ctl (/usr/lib/postgresql/*/bin) for a private wal_level=logical cluster"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, and CI is set")
        pytest.skip(reason)
    server = PrivateServer(binaries)
    with open(server.data / "postgresql.conf", "a") as config:
        config.write("\nwal_level = logical\nmax_replication_slots = 4\n")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def cdc_engine(logical_server: PrivateServer) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(logical_server.url))
    CaptureBase.metadata.create_all(engine)
    with psycopg.connect(logical_server.url, autocommit=True) as connection:
        connection.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (SLOT,))
    try:
        yield engine
    finally:
        with psycopg.connect(logical_server.url, autocommit=True) as connection:
            connection.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))  # a slot left behind pins the WAL
        CaptureBase.metadata.drop_all(engine)
        engine.dispose()


def event(order: str, kind: str, amount: int) -> OrderEvent:
    return OrderEvent(aggregatetype="order", aggregateid=order, type=kind, payload={"order": order, "amount": amount})


def captured_inserts(server: PrivateServer) -> list[dict[str, Any]]:
    """The inserts into ``order_events`` the slot decodes, in the stream's order, each as {column: value}."""
    with psycopg.connect(server.url, autocommit=True) as connection:
        lines = [line for (line,) in connection.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (SLOT,))]
    inserts = []
    for line in lines:
        if line.startswith("table public.order_events: INSERT:"):
            fields = {name: value for name, value in _FIELD.findall(line.split("INSERT:", 1)[1])}
            inserts.append({name: value[1:-1].replace("''", "'") if value.startswith("'") else value
                            for name, value in fields.items()})
    return inserts


def test_committed_rows_reach_the_change_stream_with_the_router_fields_in_commit_order(logical_server, cdc_engine):
    keys: dict[str, str] = {}

    def write(session: Session, name: str, kind: str, amount: int) -> None:
        row = event(name, kind, amount)
        capture(session, row)
        keys[name] = str(row.idempotency_key)

    with Session(cdc_engine) as session, session.begin():
        write(session, "A", "order.created", 1)
    with Session(cdc_engine) as session:
        with session.begin():
            write(session, "B", "order.created", 2)
            session.rollback()
    with Session(cdc_engine) as session, session.begin():
        write(session, "C", "order.created", 3)
        write(session, "D", "order.paid", 4)
    # Two transactions that overlap: E is written first but commits second, so it comes after F.
    first, second = Session(cdc_engine), Session(cdc_engine)
    try:
        first.begin()
        write(first, "E", "order.created", 5)
        with second.begin():
            write(second, "F", "order.created", 6)
        first.commit()
    finally:
        first.close()
        second.close()

    inserts = captured_inserts(logical_server)

    assert [row["aggregateid"] for row in inserts] == ["A", "C", "D", "F", "E"]
    for row in inserts:
        name = row["aggregateid"]
        assert row["aggregatetype"] == "order"
        assert row["idempotency_key"] == keys[name]
        assert json.loads(row["payload"]) == {"order": name, "amount": "ABCDEF".index(name) + 1}
    assert [row["type"] for row in inserts] == ["order.created", "order.created", "order.paid", "order.created", "order.created"]
    with cdc_engine.connect() as connection:  # inserted and deleted in the same transaction: nothing waits in the table
        assert connection.scalar(select(func.count()).select_from(OrderEvent)) == 0
