"""docs/async.md, extracted and run: an async FastAPI app enqueues with AsyncSession and Core, the kit delivers.

The page's ``# file:`` blocks are written to a package in a temporary folder
and run against a real PostgreSQL and a real receiver, so the page cannot
drift from the library.
"""

from __future__ import annotations

import importlib
from datetime import datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.support.database import libpq_url, sqlalchemy_url
from tests.support.doc_pages import create_schema, forget_package, page_files, write_package


@pytest.fixture
def shop(tmp_path, monkeypatch, database_factory, receiver):
    url = database_factory.create_empty()
    write_package(tmp_path, page_files("async.md"), receiver_url=receiver.url)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", libpq_url(url))  # a bare postgresql:// URL, as a platform hands it out
    monkeypatch.setenv("OUTBOXKIT_LEADER_TICK_SECONDS", "0.2")
    models = importlib.import_module("shop.models")
    engine = create_engine(sqlalchemy_url(url))
    create_schema(engine, models.Base.metadata, [models.OrderOutbox])
    yield models, engine
    engine.dispose()
    forget_package("shop")
    database_factory.drop(url)


def test_the_async_app_enqueues_with_async_session_and_core_and_the_kit_delivers(shop, receiver):
    models, engine = shop
    app_module = importlib.import_module("shop.app")
    backfill = importlib.import_module("shop.backfill")
    assert app_module.kit.engine.dialect.driver == "psycopg" and not app_module.kit.engine.dialect.is_async
    with TestClient(app_module.app) as client:  # the lifespan elects this process and starts the schedule
        placed = client.post("/orders", json={"customer": "ann", "total": "12.50"})
        assert placed.status_code == 201, placed.text
        imported = client.post("/orders/import", json=[{"customer": "bo", "total": "3.10"}, {"customer": "cy", "total": "7"}])
        assert imported.status_code == 201, imported.text
        first = placed.json()["order_id"]
        backfill.announce_again(first)  # sync Core insert through kit.engine
        receiver.wait_for(lambda r: len(r.requests) >= 4, timeout=60)  # NOTIFY woke the leader's drain

    bodies = sorted((request.body for request in receiver.requests), key=lambda body: (body["order"], body["total"]))
    assert [(body["order"], body["total"]) for body in bodies] == [
        (first, "12.50"),
        (first, "12.50"),
        (first + 1, "3.10"),
        (first + 2, "7.00"),
    ]
    for body in bodies:
        assert datetime.fromisoformat(body["placed_at"]).utcoffset() is not None  # ISO 8601 with its offset
    assert len(set(receiver.keys())) == 4  # the backfill's row is a new row with its own idempotency key
    with Session(engine) as session:
        assert set(session.scalars(select(models.OrderOutbox.status))) == {"done"}
        assert session.scalar(select(models.Order.customer).where(models.Order.id == first)) == "ann"
