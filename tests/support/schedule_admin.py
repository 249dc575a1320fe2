"""An admin app for the schedule pages and API: the admin router behind HTTP Basic, over a kit that knows
the ``ScheduledCall`` outbox (HTTP targets) and the test jobs (``record``, ``blocking``, ``failing``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from exampleapp.admin_app import require_admin
from exampleapp.models import WebhookOutbox
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from outboxkit import Clock, ManualClock, OutboxKit, OutboxKitSettings
from outboxkit.admin import create_admin_router
from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER
from tests.support.database import sqlalchemy_url
from tests.support.models import ScheduledCall
from tests.support.schedules import LOOPBACK_ALLOWED

JOBS = ("record", "blocking", "failing")
START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)  # the ManualClock's time in the fixtures below
CSRF_SECRET = "schedule-admin-tests-csrf-secret"


@dataclass
class ScheduleAdminApp:
    app: FastAPI
    client: TestClient
    kit: OutboxKit
    engine: Engine

    def clear(self) -> None:
        """Empty the schedule tables and the run history (DELETE: cheap on small tables)."""
        with self.engine.begin() as connection:
            for table in ("outboxkit_schedule_leases", "outboxkit_schedules", "outboxkit_schedule_audit", "outboxkit_job_runs"):
                connection.execute(text(f"DELETE FROM {table}"))
        self.client.cookies.clear()

    def record_run(self, name: str, at: datetime, outcome: str, *, error: str | None = None, counts: Any = None) -> None:
        """An occurrence in the history as the runner records it."""
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, finished_at, outcome, "
                    "counts, error, leader) VALUES (:name, :name, :at, :at, :at, :outcome, CAST(:counts AS jsonb), :error, "
                    "'host-a:11:abcd')"
                ),
                {"name": name, "at": at, "outcome": outcome, "error": error, "counts": "{}" if counts is None else counts},
            )


@contextmanager
def schedule_admin_app(
    database_url: str, *, clock: Clock | None = None, settings: OutboxKitSettings | None = None
) -> Iterator[ScheduleAdminApp]:
    """``settings`` default to the test receivers' allow-list (127.0.0.1)."""
    engine = create_engine(sqlalchemy_url(database_url), pool_size=3, max_overflow=0, pool_pre_ping=True)
    settings = settings or OutboxKitSettings(listen_enabled=False, url_allow_list=LOOPBACK_ALLOWED)
    kit = OutboxKit(engine, [WebhookOutbox, ScheduledCall], clock=clock, settings=settings)
    app = FastAPI(title="schedule admin tests")
    app.include_router(
        create_admin_router(
            kit,
            dependencies=[Depends(require_admin(ADMIN_USER, ADMIN_PASSWORD))],
            csrf_secret=CSRF_SECRET,
            schedule_jobs=JOBS,
        ),
        prefix="/admin",
    )
    try:
        with TestClient(app, follow_redirects=False) as client:
            client.auth = (ADMIN_USER, ADMIN_PASSWORD)
            yield ScheduleAdminApp(app=app, client=client, kit=kit, engine=engine)
    finally:
        kit.close()
        engine.dispose()


def kit_from_environment() -> OutboxKit:
    """The kit the CLI tests load (``--app tests.support.schedule_admin:kit_from_environment``), on ``DATABASE_URL``."""
    import os

    engine = create_engine(sqlalchemy_url(os.environ["DATABASE_URL"]), pool_size=2, max_overflow=0)
    return OutboxKit(
        engine, [WebhookOutbox, ScheduledCall], settings=OutboxKitSettings(listen_enabled=False, url_allow_list=LOOPBACK_ALLOWED)
    )


@pytest.fixture(scope="module")
def schedule_admin_module(admin_database_url: str) -> Iterator[ScheduleAdminApp]:
    """One schedule admin app per test module, on a ManualClock."""
    with schedule_admin_app(admin_database_url, clock=ManualClock(START)) as app:
        yield app


@pytest.fixture
def schedule_admin(schedule_admin_module: ScheduleAdminApp) -> ScheduleAdminApp:
    """The module's app with empty schedule tables and run history, its clock back at ``START``."""
    schedule_admin_module.clear()
    schedule_admin_module.kit.clock.set(START)  # type: ignore[attr-defined]
    return schedule_admin_module
