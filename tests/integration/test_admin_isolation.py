"""The admin cannot hurt the application it serves: its own small pool, a time limit on each of its transactions.

A heavy admin query is made deterministic here by holding a lock the admin's
statements must wait for (an ACCESS EXCLUSIVE lock on the outbox table, or a
row lock): PostgreSQL's ``statement_timeout`` counts lock waits, and the
waiting sessions show in ``pg_stat_activity``, so the tests can see which
connections the admin holds without timing anything.  Each lock holder ends
its own transaction after ``idle_in_transaction_session_timeout``, so without
the limits these tests fail instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager

import httpx
import psycopg
import pytest
from exampleapp.admin_app import create_app
from sqlalchemy import text

from outboxkit import ManualClock, OutboxKitSettings
from outboxkit.admin.route_guard import SECURITY_HEADERS
from outboxkit.storage.operator_pool import APPLICATION_NAME
from tests.support.admin import (  # noqa: F401  (fixtures)
    ADMIN_PASSWORD,
    ADMIN_USER,
    START,
    ServedApp,
    add_webhooks,
    admin_database_url,
    admin_harness,
    empty_tables,
    snapshot,
)
from tests.support.database import libpq_url

TIME_LIMIT = 1.0
FILTERED = "/admin/api/outboxes/webhooks/rows?status=done&payload_column=payload&payload_contains=xy&counts=true"
FILTERED_PAGE = "/admin/outboxes/webhooks?status=done&payload_column=payload&payload_contains=xy"


@pytest.fixture(scope="module")
def limited(admin_database_url):
    settings = OutboxKitSettings(admin_statement_timeout_seconds=TIME_LIMIT, admin_pool_size=2, admin_pool_timeout_seconds=0.5)
    with admin_harness(admin_database_url, clock=ManualClock(START), settings=settings) as harness:
        yield harness


@pytest.fixture
def admin(limited, admin_database_url):
    empty_tables(admin_database_url)
    limited.client.cookies.clear()
    return limited


@contextmanager
def locked(database_url: str, statement: str) -> Iterator[psycopg.Connection]:
    """A transaction holding the lock ``statement`` takes, ended by the server after 20 idle seconds at the latest."""
    with psycopg.connect(libpq_url(database_url)) as connection:
        connection.execute("SET idle_in_transaction_session_timeout = '20s'")
        connection.execute(statement)
        yield connection
        connection.rollback()


def sessions_waiting_on_a_lock(database_url: str) -> list[str]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()
    return [name for (name,) in rows]


def await_condition(check, *, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "the condition was not met in time"
        time.sleep(0.02)
    return value


# -- the time limit ------------------------------------------------------------------


def test_every_operator_transaction_runs_under_the_time_limit_and_the_applications_engine_does_not(admin):
    with admin.kit.operator_database.connect() as connection:
        limit = connection.execute(text("SHOW statement_timeout")).scalar_one()
        workers = connection.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one()
        name = connection.execute(text("SELECT current_setting('application_name')")).scalar_one()
        connection.execute(text("SELECT pg_sleep(0.2)"))
        later = connection.execute(text("SHOW statement_timeout")).scalar_one()
    assert limit.endswith("ms") and 0 < int(limit[:-2]) <= TIME_LIMIT * 1000
    assert int(later[:-2]) <= int(limit[:-2]) - 200  # one budget for the whole transaction, not one per statement
    assert workers == "0" and name == APPLICATION_NAME
    with admin.engine.connect() as connection:  # the application's own engine keeps its settings
        assert connection.execute(text("SHOW statement_timeout")).scalar_one() == "0"


def test_a_query_over_the_time_limit_gets_narrow_the_filter_as_json_and_as_a_page_and_changes_nothing(
    admin, admin_database_url
):
    row_id = add_webhooks(admin.engine, 1, status="stuck")[0]
    before = snapshot(admin.engine)
    with locked(admin_database_url, "LOCK TABLE webhook_outbox IN ACCESS EXCLUSIVE MODE"):
        api = admin.client.get(FILTERED)
        overview = admin.client.get("/admin/api/outboxes")  # a route without its own refusal mapping
        page = admin.client.get(FILTERED_PAGE)
        reset = admin.client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    for response in (api, overview, reset):
        assert response.status_code == 503, response.text
        assert "Narrow the filter" in response.json()["detail"]
        assert "OUTBOXKIT_ADMIN_STATEMENT_TIMEOUT_SECONDS" in response.json()["detail"]
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert "Narrow the filter" in page.text
    assert all(page.headers[name] == value for name, value in SECURITY_HEADERS.items())
    assert snapshot(admin.engine) == before
    assert admin.client.get(FILTERED).status_code == 200  # the lock gone, the same request answers


# -- the admin's own pool ------------------------------------------------------------


def test_admin_requests_hold_only_the_admins_own_connections_and_the_surplus_is_told_it_is_busy(admin_database_url):
    empty_tables(admin_database_url)
    settings = OutboxKitSettings(admin_statement_timeout_seconds=30, admin_pool_size=2, admin_pool_timeout_seconds=0.5)
    app = create_app(admin_database_url, admin_password=ADMIN_PASSWORD, settings=settings, pool_size=3)
    kit = app.state.outboxkit
    with (
        ServedApp(app) as base_url,
        httpx.Client(base_url=base_url, auth=(ADMIN_USER, ADMIN_PASSWORD), timeout=60) as client,
        ThreadPoolExecutor(4) as pool,
    ):
        client.get("/admin/api/outboxes").raise_for_status()
        with locked(admin_database_url, "LOCK TABLE webhook_outbox IN ACCESS EXCLUSIVE MODE"):
            requests = [pool.submit(client.get, FILTERED) for _ in range(4)]
            waiting = await_condition(lambda: len(names := sessions_waiting_on_a_lock(admin_database_url)) >= 2 and names)
            # Two admin requests wait on the lock, on the admin's two connections; the application's pool is untouched.
            assert waiting == [APPLICATION_NAME, APPLICATION_NAME]
            assert kit.engine.pool.checkedout() == 0
            with kit.engine.connect() as first, kit.engine.connect() as second, kit.engine.connect() as third:
                for connection in (first, second, third):  # every one of the application's 3 connections is free
                    assert connection.execute(text("SELECT 1")).scalar_one() == 1
            busy: list = []
            while len(busy) < 2:  # the other two give up waiting for a connection
                done, _ = wait([request for request in requests if request not in busy], timeout=30, return_when=FIRST_COMPLETED)
                assert done, "the surplus requests did not give up"
                busy += done
        # the lock released: the two waiting requests finish
        answers = [request.result() for request in requests]
    assert sorted(response.status_code for response in answers) == [200, 200, 503, 503]
    for request in busy:
        assert request.result().status_code == 503
        assert "connections (OUTBOXKIT_ADMIN_POOL_SIZE) stayed busy" in request.result().json()["detail"]


def test_the_operator_pool_is_closed_with_the_kit(admin):
    database = admin.kit.operator_database
    with database.connect() as connection:
        connection.execute(text("SELECT 1"))
    assert database.engine.pool.checkedin() >= 1
    admin.kit.close()
    assert database.engine.pool.checkedin() == 0
