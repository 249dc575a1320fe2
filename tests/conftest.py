"""Shared fixtures: a real PostgreSQL database per test, a real receiver, a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import Engine, create_engine

from exampleapp.models import Base as ExampleBase
from outboxkit import ManualClock
from outboxkit.tables import kit_metadata
from tests.support.database import DatabaseFactory, server_url, sqlalchemy_url
from tests.support.models import SampleBase
from tests.support.receiver import Receiver


@pytest.fixture(scope="session")
def database_factory() -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(server_url(), [ExampleBase.metadata, SampleBase.metadata, kit_metadata])
    yield factory
    factory.close()


@pytest.fixture
def database_url(database_factory: DatabaseFactory) -> Iterator[str]:
    """libpq URL of a fresh database holding the example and sample tables."""
    url = database_factory.create()
    yield url
    database_factory.drop(url)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(database_url), pool_size=10, max_overflow=20)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


# Every outbox in the template notifies its channel on insert, as an
# application's migration would install it (outboxkit.notify.install_trigger_sql).
def _install_notify_triggers() -> None:
    from sqlalchemy import DDL, event

    from exampleapp.models import CreditGrantOutbox, WebhookOutbox
    from outboxkit.notify import install_trigger_sql
    from tests.support.models import SampleEvent

    for outbox in (CreditGrantOutbox, WebhookOutbox, SampleEvent):
        for statement in install_trigger_sql(outbox):
            event.listen(outbox.__table__, "after_create", DDL(statement))


_install_notify_triggers()
