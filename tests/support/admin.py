"""Helpers for the admin tests: the example admin app on a test database, and rows to look at."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest
import uvicorn
from exampleapp.admin_app import create_app
from fastapi import FastAPI
from fastapi.testclient import TestClient
from psycopg import sql
from sqlalchemy import Engine, create_engine, text

from outboxkit import ManualClock, OutboxKit
from outboxkit.breaker import destination_of
from outboxkit.storage.notify import channel_for
from tests.support.database import libpq_url, sqlalchemy_url

ADMIN_USER = "admin"
ADMIN_PASSWORD = "correct horse battery staple"


TABLES = (
    "webhook_outbox",
    "credit_grant_outbox",
    "grants",
    "sample_event_outbox",
    "outboxkit_job_runs",
    "outboxkit_job_fences",
    "outboxkit_reset_audit",
    "outboxkit_attempts",
    "outboxkit_outbox_pauses",
    "outboxkit_outbox_minutes",
    "outboxkit_destinations",
    "outboxkit_destination_limits",
    "outboxkit_secrets",
    "outboxkit_wakeups",
)


@pytest.fixture(scope="module")
def admin_database_url(database_factory) -> Iterator[str]:
    """One database per test module (creating one per test costs seconds on a busy server)."""
    url = database_factory.create()
    yield url
    database_factory.drop(url)


def empty_tables(database_url: str) -> None:
    """DELETE, not TRUNCATE (which costs a new file per table); ANALYZE so row estimates start from zero."""
    engine = create_engine(sqlalchemy_url(database_url), pool_size=1)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            for table in TABLES:
                connection.execute(text(f"DELETE FROM {table}"))
            connection.execute(text("ANALYZE webhook_outbox"))
    finally:
        engine.dispose()


START = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def admin_app(admin_database_url: str) -> Iterator[AdminHarness]:
    """One example admin app per module (building one costs a few hundred ms) on a manual clock."""
    with admin_harness(admin_database_url, clock=ManualClock(START)) as harness:
        yield harness


@pytest.fixture
def admin(admin_app: AdminHarness, admin_database_url: str) -> AdminHarness:
    """The module's admin app with empty tables and its clock back at ``START``."""
    empty_tables(admin_database_url)
    admin_app.clock.set(START)
    admin_app.client.cookies.clear()
    return admin_app


@dataclass
class AdminHarness:
    app: FastAPI
    client: TestClient
    kit: OutboxKit
    engine: Engine

    @property
    def clock(self) -> ManualClock:
        assert isinstance(self.kit.clock, ManualClock), "this harness was built without a ManualClock"
        return self.kit.clock


@contextmanager
def admin_harness(database_url: str, **options: Any) -> Iterator[AdminHarness]:
    """The example admin app (HTTP Basic) with a TestClient that signs in."""
    app = create_app(database_url, admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD, pool_size=3, **options)
    with TestClient(app, follow_redirects=False) as client:
        client.auth = (ADMIN_USER, ADMIN_PASSWORD)
        yield AdminHarness(app=app, client=client, kit=app.state.outboxkit, engine=app.state.engine)


def add_webhooks(
    engine: Engine,
    count: int = 1,
    *,
    status: str = "stuck",
    error: str | None = "receiver answered 400",
    status_code: int | None = 400,
    attempts: int = 1,
    next_attempt_at: datetime | None = None,
    claimed_until: datetime | None = None,
    target_url: str = "http://127.0.0.1:9/hook",
    payload: Any = None,
    event: str = "grant.created",
) -> list[int]:
    """Insert ``count`` webhook rows in one statement; return their ids in insert order."""
    statement = text(
        "INSERT INTO webhook_outbox (event, target_url, destination, payload, status, attempts, last_error, "
        "last_status_code, next_attempt_at, claimed_until, delivered_at) "
        "SELECT :event, :target_url, :destination, CAST(:payload AS jsonb), CAST(:status AS text), :attempts, :error, "
        ":status_code, "
        "COALESCE(CAST(:next_attempt_at AS timestamptz), now()), CAST(:claimed_until AS timestamptz), "
        "CASE WHEN CAST(:status AS text) = 'done' THEN now() END "
        "FROM generate_series(1, :count) RETURNING id"
    )
    params = {
        "event": event,
        "target_url": target_url,
        "destination": destination_of(target_url),  # as an insert through the model decides it
        "payload": json.dumps(payload if payload is not None else {"n": 1}),
        "status": status,
        "attempts": attempts,
        "error": error,
        "status_code": status_code,
        "next_attempt_at": next_attempt_at,
        "claimed_until": claimed_until,
        "count": count,
    }
    with engine.begin() as connection:
        return sorted(connection.execute(statement, params).scalars())


def snapshot(engine: Engine) -> list[tuple[Any, ...]]:
    """Every outbox row's kit columns and the audit: equal snapshots mean nothing changed."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, status, attempts, next_attempt_at, claimed_until, claim_token, updated_at FROM webhook_outbox "
                "UNION ALL SELECT id, status, attempts, next_attempt_at, claimed_until, claim_token, updated_at "
                "FROM credit_grant_outbox ORDER BY 1"
            )
        ).all()
        audit = connection.execute(text("SELECT count(*) FROM outboxkit_reset_audit")).scalar_one()
    return [tuple(row) for row in rows] + [("audit", audit)]


def row_of(engine: Engine, row_id: int) -> dict[str, Any]:
    with engine.connect() as connection:
        return dict(connection.execute(text("SELECT * FROM webhook_outbox WHERE id = :id"), {"id": row_id}).one()._mapping)


def audit_entries(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(text("SELECT * FROM outboxkit_reset_audit ORDER BY id"))]


def record_run(
    engine: Engine, job_id: str, job_name: str, at: datetime, outcome: str = "ok", counts: dict[str, int] | None = None
) -> None:
    """A scheduler run in ``outboxkit_job_runs``, as the scheduler would record it."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO outboxkit_job_runs "
                "(job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, leader) "
                "VALUES (:job_id, :job_name, :at, :at, :at, :outcome, CAST(:counts AS jsonb), 'host-a:11')"
            ),
            {"job_id": job_id, "job_name": job_name, "at": at, "outcome": outcome, "counts": json.dumps(counts or {})},
        )


def cookie_named(client: TestClient, prefix: str) -> Any:
    """The client's one cookie whose name starts with ``prefix`` (the admin names its cookies per mount)."""
    found = [cookie for cookie in client.cookies.jar if cookie.name.startswith(prefix)]
    assert len(found) == 1, f"expected one {prefix}* cookie, got {[cookie.name for cookie in found]}"
    return found[0]


class ServedApp:
    """An ASGI app served by uvicorn in a background thread on a free local port."""

    def __init__(self, app) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="admin-uvicorn", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@contextmanager
def listening(database_url: str, outbox: type) -> Iterator[psycopg.Connection]:
    """A psycopg connection that LISTENs on ``outbox``'s NOTIFY channel, as a drainer would."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_for(outbox))))
        yield connection


def notified(connection: psycopg.Connection, *, timeout: float = 10.0) -> list[str]:
    """The channels notified so far; waits up to ``timeout`` for the first one."""
    return [notification.channel for notification in connection.notifies(timeout=timeout, stop_after=1)]
