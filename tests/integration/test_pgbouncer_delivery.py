"""The whole delivery story through a real PgBouncer, in transaction mode and in session mode.

Deployed as docs/operations.md says: the application's engine goes through
the pooler (in transaction mode built with ``prepare_threshold=None``, as
PgBouncer 1.18 needs), the lock and LISTEN connections through a session
pool, ``OUTBOXKIT_ENVIRONMENT=production``.  The app (its lifespan and the
admin) runs in a TestClient; rows are enqueued one transaction each, as an
application writes them, and must be delivered, retried and parked stuck
with every outcome and attempt recorded, woken by NOTIFY (the safety-net
poll is an hour away), shown by the admin and reset from it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator

import pytest
from exampleapp.admin_app import mount_admin
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings
from outboxkit.leader.election import ElectionState
from tests.support.database import sqlalchemy_url
from tests.support.leadership import holder_count, wait_until
from tests.support.models import SampleEvent
from tests.support.pgbouncer import PgBouncer, transaction_and_session_pools
from tests.support.receiver import Reply

ADMIN = ("admin", "pgbouncer-test-password")
ROWS = {"/ok": 10, "/flaky": 3, "/bad": 2}  # delivered, retried once then delivered, parked stuck (400)
ENGINE_POOL = {"pool_size": 3, "max_overflow": 2}  # the session pool must hold this plus the lock and LISTEN


@pytest.fixture(scope="module")
def bouncers(database_factory) -> Iterator[dict[str, PgBouncer]]:
    # Session pool, per process: the engine's pool_size + max_overflow, plus 2 (the lock and LISTEN connections),
    # plus the start-up proof's second connection for a moment; 20 leaves room for the test's own connections.
    with transaction_and_session_pools(database_factory.server, transaction_size=5, session_size=20) as pools:
        yield pools


class ReceiverScript:
    """/ok answers 200; /flaky 503 the first time per row, then 200; /bad 400 until ``fixed``."""

    def __init__(self) -> None:
        self.fixed = threading.Event()
        self._seen: collections.Counter[str | None] = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, request) -> Reply:
        with self._lock:
            self._seen[request.key] += 1
            first = self._seen[request.key] == 1
        if request.path == "/flaky" and first:
            return Reply(status=503)
        if request.path == "/bad" and not self.fixed.is_set():
            return Reply(status=400)
        return Reply()


def statuses(engine) -> dict[str, list[tuple[str, int]]]:
    with Session(engine) as session:
        rows = session.scalars(select(SampleEvent).order_by(SampleEvent.id)).all()
        found: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        for row in rows:
            found[row.target_url.rsplit("/", 1)[1]].append((row.status, row.attempts))
        return dict(found)


def recorded_attempts(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM outboxkit_attempts")).scalar_one()


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_rows_are_delivered_retried_parked_shown_and_reset_through_pgbouncer(
    engine, database_url, bouncers, receiver, caplog, pool_mode
):
    # In transaction mode psycopg must not prepare statements (PgBouncer before 1.21 loses them).
    connect_args = {"prepare_threshold": None} if pool_mode == "transaction" else {}
    pooled = create_engine(sqlalchemy_url(bouncers[pool_mode].url_for(database_url)), connect_args=connect_args, **ENGINE_POOL)
    settings = OutboxKitSettings(
        environment="production",
        # Transaction mode: the lock and LISTEN connections go to the session pool.  Session mode: unset, so
        # they come from the engine, which is a session pool already.
        lock_database_url=bouncers["session"].url_for(database_url) if pool_mode == "transaction" else None,
        leader_tick_seconds=0.2,
        standby_probe_seconds=0.2,
        drain_interval_seconds=3600,  # the safety net is an hour away: only NOTIFY and due times send
        outboxes={"sample_events": {"backoff": [1], "max_attempts": 5}},
    )
    kit = OutboxKit(pooled, [SampleEvent], settings=settings)
    app = FastAPI(lifespan=kit.lifespan)
    mount_admin(app, kit, admin_user=ADMIN[0], admin_password=ADMIN[1])
    script = ReceiverScript()
    receiver.respond = script
    try:
        with caplog.at_level(logging.INFO, logger="outboxkit"), TestClient(app, follow_redirects=False) as client:
            client.auth = ADMIN
            listener = kit.worker.listener
            assert listener is not None and listener.wait_for_generation(1, timeout=20)
            assert kit.scheduler.election.wait_for(ElectionState.LEADER, timeout=20)
            assert holder_count(engine) == 1

            for path, count in ROWS.items():  # one transaction per row, through the pooler, as the app writes them
                for n in range(count):
                    with Session(pooled) as session, session.begin():
                        session.add(SampleEvent(target_url=f"{receiver.url}{path}", payload={"n": n}))
            expected_requests = ROWS["/ok"] + 2 * ROWS["/flaky"] + ROWS["/bad"]
            receiver.wait_for(lambda r: len(r.requests) == expected_requests, timeout=60)
            wait_until(
                lambda: statuses(engine)
                == {"ok": [("done", 1)] * 10, "flaky": [("done", 2)] * 3, "bad": [("stuck", 1)] * 2},
                timeout=30,
                message="every outcome recorded",
            )
            wait_until(lambda: recorded_attempts(engine) == expected_requests, timeout=30, message="the attempt history")

            overview = client.get("/admin/")
            assert overview.status_code == 200 and "sample-events" in overview.text
            stuck = client.get("/admin/api/outboxes/sample-events/rows", params={"status": "stuck"})
            assert stuck.status_code == 200
            stuck_ids = sorted(row["id"] for row in stuck.json()["rows"])
            assert len(stuck_ids) == 2
            leader = client.get("/admin/api/outboxes").json()["leader"]
            assert leader is not None

            script.fixed.set()
            reset = client.post("/admin/api/outboxes/sample-events/reset", json={"ids": stuck_ids})
            assert reset.status_code == 200 and sorted(reset.json()["changed_ids"]) == stuck_ids
            # The reset's NOTIFY wakes the drain: both rows are sent again and delivered.
            receiver.wait_for(lambda r: len(r.requests) == expected_requests + 2, timeout=30)
            wait_until(
                lambda: statuses(engine)["bad"] == [("done", 1)] * 2, timeout=30, message="the reset rows delivered"
            )
        with Session(engine) as session:
            assert session.scalar(select(func.count()).where(SampleEvent.status != "done")) == 0
        assert len({request.key for request in receiver.requests}) == sum(ROWS.values())
        assert holder_count(engine) == 0, "the lock is released on shutdown"
        problems = [
            record.getMessage()
            for record in caplog.records
            if record.levelno >= logging.ERROR or "prepared statement" in record.getMessage()
        ]
        assert problems == []
    finally:
        kit.close()
        pooled.dispose()


@pytest.mark.parametrize("environment", ["production", "development"])
def test_an_engine_that_prepares_statements_through_the_transaction_pool_is_refused_in_production(
    database_url, bouncers, caplog, environment
):
    # psycopg's default: a statement is prepared on its 5th run, which PgBouncer 1.18 in transaction mode loses.
    pooled = create_engine(sqlalchemy_url(bouncers["transaction"].url_for(database_url)), **ENGINE_POOL)
    settings = OutboxKitSettings(
        environment=environment,
        lock_database_url=bouncers["session"].url_for(database_url),
        leader_tick_seconds=3600,
        drain_interval_seconds=3600,
    )
    kit = OutboxKit(pooled, [SampleEvent], settings=settings)
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit"):
            if environment == "production":
                fix = r"prepare_threshold=5.*connect_args=\{'prepare_threshold': None\}"
                for start in (kit.worker.start, kit.scheduler.elect):
                    with pytest.raises(ConfigurationError, match=fix):
                        start()
                assert not kit.worker.running and kit.scheduler.election is None
            else:
                kit.worker.start()
                assert kit.worker.running
                assert any("prepare_threshold=5" in record.getMessage() for record in caplog.records)
    finally:
        kit.close()
        pooled.dispose()
