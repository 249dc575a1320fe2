"""An admin app over the ordered test outbox (``OrderedEvent``), and rows of it to look at."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from exampleapp.admin_app import mount_admin
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, insert, text

from outboxkit import Clock, OutboxKit, OutboxKitSettings
from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER, AdminHarness
from tests.support.database import sqlalchemy_url
from tests.support.models import OrderedEvent


@contextmanager
def ordered_admin_harness(database_url: str, *, clock: Clock | None = None) -> Iterator[AdminHarness]:
    """The admin (HTTP Basic, under /admin) over a kit of ``OrderedEvent``, with a TestClient that signs in."""
    engine = create_engine(sqlalchemy_url(database_url), pool_size=3, max_overflow=0)
    kit = OutboxKit(engine, [OrderedEvent], settings=OutboxKitSettings(), clock=clock)
    app = FastAPI()
    app.state.outboxkit, app.state.engine = kit, engine
    mount_admin(app, kit, admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD)
    try:
        with TestClient(app, follow_redirects=False) as client:
            client.auth = (ADMIN_USER, ADMIN_PASSWORD)
            yield AdminHarness(app=app, client=client, kit=kit, engine=engine)
    finally:
        kit.close()
        engine.dispose()


def add_ordered(engine: Any, rows: list[tuple[str | None, int]], *, target_url: str, status: str = "pending") -> list[int]:
    """OrderedEvent rows ``(stream, n)`` in that id order; a ``stuck`` one as a 400 leaves it."""
    values = [{"target_url": target_url, "stream": stream, "payload": {"stream": stream, "n": n}} for stream, n in rows]
    statement = insert(OrderedEvent).returning(OrderedEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        ids = list(connection.scalars(statement, values))
        if status != "pending":
            connection.execute(
                text("UPDATE ordered_event_outbox SET status = :status, attempts = 1, last_status_code = 400, "
                     "last_error = 'receiver answered 400' WHERE id = ANY(:ids)"),
                {"status": status, "ids": ids},
            )
    return ids


def ordered_status(engine: Any) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(text("SELECT id, status FROM ordered_event_outbox ORDER BY id")).all())


def ordered_kit_from_environment() -> OutboxKit:
    """A kit of ``OrderedEvent`` on ``DATABASE_URL``, for the CLI tests (``--app`` names it)."""
    import os

    return OutboxKit(create_engine(os.environ["DATABASE_URL"], pool_size=2), [OrderedEvent], settings=OutboxKitSettings())
