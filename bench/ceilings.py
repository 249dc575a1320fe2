"""The two ceilings a drain is measured against, on the same receiver and database.

* ``httpx_posts_per_second``: raw POSTs through one reused ``httpx.Client``
  with the body and headers a drain sends, from ``threads`` threads.  With one
  thread it is the fastest one sequential sender in Python can go; with the
  drain's concurrency it shows what the threads add (or cost, under the GIL).
* ``primitive_rows_per_second``: the database half alone.  Claim a batch with
  the drain's own ``FOR UPDATE SKIP LOCKED`` statement in a committed
  transaction, then mark the batch ``done`` (guarded by the claim token) in a
  second one; no HTTP, raw psycopg, one connection.

A drain that does both halves in one process cannot beat the lower of the two.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import httpx
import psycopg
from sqlalchemy import Engine, MetaData, create_engine
from sqlalchemy.engine import make_url

from outboxkit.storage.drain_queries import claim_sql, rate_parameters

# The drain's claim statement, with SQLAlchemy's :name parameters in psycopg's style.
PRIMITIVE_CLAIM = re.sub(r"(?<!:):(\w+)", r"%(\1)s", claim_sql("{table}")).replace("RETURNING outbox.*", "RETURNING outbox.id")
PRIMITIVE_MARK_DONE = """
UPDATE {table}
SET status = 'done', delivered_at = %(now)s, claim_token = NULL, claimed_until = NULL, updated_at = %(now)s
WHERE id = ANY(%(ids)s) AND claim_token = %(token)s
"""
BODY = b'{"event":"bench.ceiling","data":{"n":1,"workspace":"ws-1"}}'


def httpx_posts_per_second(url: str, *, count: int, threads: int = 1) -> float:
    """POSTs per second through one shared client, ``count`` in all, from ``threads`` threads."""
    limits = httpx.Limits(max_connections=max(threads, 1), max_keepalive_connections=max(threads, 1))
    with httpx.Client(limits=limits) as client:
        client.post(url, content=BODY, headers={"Content-Type": "application/json"})  # open the first connection
        remaining = [count]
        lock = threading.Lock()

        def sender() -> None:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                headers = {"Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())}
                client.post(url, content=BODY, headers=headers, timeout=10.0).raise_for_status()

        workers = [threading.Thread(target=sender) for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return count / (time.perf_counter() - started)


def insert_pending_rows(connection: psycopg.Connection, table: str, *, count: int, target_url: str) -> None:
    """Bulk-insert ``count`` due rows (benchmark set-up, not an enqueue measurement)."""
    connection.execute(
        f"INSERT INTO {table} (event, target_url, payload) "
        "SELECT 'bench.event', %(url)s, jsonb_build_object('n', n, 'workspace', 'ws-' || (n %% 100)) "
        "FROM generate_series(1, %(count)s) AS n",
        {"url": target_url, "count": count},
    )
    connection.commit()


def vacuum_analyze(connection: psycopg.Connection, table: str) -> None:
    """Leave the table as autovacuum soon would, so each phase starts from the same state."""
    connection.commit()
    connection.autocommit = True
    try:
        connection.execute(f"VACUUM ANALYZE {table}")
    finally:
        connection.autocommit = False


def primitive_rows_per_second(database_url: str, table: str, *, count: int, batch_size: int, target_url: str) -> float:
    """Claim-and-mark rows per second on ``count`` freshly inserted rows; empties the table afterwards."""
    with psycopg.connect(database_url) as connection:
        insert_pending_rows(connection, table, count=count, target_url=target_url)
        vacuum_analyze(connection, table)
        claim = PRIMITIVE_CLAIM.format(table=table)  # as the drain claims (asynchronous commit)
        mark = PRIMITIVE_MARK_DONE.format(table=table)
        lease = timedelta(seconds=60)
        done = 0
        started = time.perf_counter()
        while True:
            now = datetime.now(timezone.utc)
            token = uuid.uuid4()
            ids = [
                row[0]
                for row in connection.execute(
                    claim, {"now": now, "lease_until": now + lease, "limit": batch_size, "token": token,
                            # the drain's claim walks destinations from a cursor; these rows share one
                            "outbox": "bench-ceiling", "after": None, "cap": batch_size, "unknown_suspect": True,
                            "steps": batch_size * 4, "probes": 1, **rate_parameters(None)}
                )
            ]
            connection.commit()
            if not ids:
                break
            connection.execute(mark, {"ids": ids, "token": token, "now": datetime.now(timezone.utc)})
            connection.commit()
            done += len(ids)
        elapsed = time.perf_counter() - started
        connection.execute(f"TRUNCATE {table}")
        connection.commit()
    if done != count:
        raise RuntimeError(f"the primitive marked {done} rows, expected {count}")
    return done / elapsed


@dataclass(frozen=True)
class ScratchDatabase:
    """Where a benchmark's scratch database lives: the server, the database's libpq and SQLAlchemy URLs."""

    name: str
    server_url: str
    database_url: str
    sqlalchemy_url: str


def scratch_database(default_server: str = "postgresql://root@127.0.0.1:5432/test") -> ScratchDatabase:
    """Names a fresh scratch database on ``DATABASE_URL`` (else ``default_server``); the caller creates and drops it."""
    server = make_url(os.environ.get("DATABASE_URL") or default_server).set(drivername="postgresql")
    name = f"outboxkit_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    return ScratchDatabase(
        name=name,
        server_url=server.render_as_string(hide_password=False),
        database_url=server.set(database=name).render_as_string(hide_password=False),
        sqlalchemy_url=server.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False),
    )


@contextmanager
def scratch_engine(*metadata: MetaData, pool_size: int = 2) -> Iterator[Engine]:
    """An engine on a fresh scratch database holding ``metadata``'s tables; the database is dropped on exit."""
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=pool_size)
    try:
        for each in metadata:
            each.create_all(engine)
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
