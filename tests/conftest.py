"""Shared fixtures: a real PostgreSQL database per test, a real receiver, a manual clock.

Each test is also marked with its kind, the first folder under tests/
(``unit``, ``integration``, ``migrations``, ``browser``, ``faults``), so a
run can pick kinds with ``-m`` as well as by path.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from exampleapp.models import Base as ExampleBase
from sqlalchemy import Engine, create_engine

from outboxkit import ManualClock
from outboxkit.storage.tables import kit_metadata
from tests.support.database import DatabaseFactory, server_url, sqlalchemy_url
from tests.support.models import SampleBase
from tests.support.receiver import Receiver

TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "integration", "migrations", "browser", "faults")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else None
        if kind in KINDS:
            item.add_marker(kind)


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
    database_factory.discard(url)


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
# application's migration would install it (outboxkit.storage.notify.install_trigger_sql).
def _install_notify_triggers() -> None:
    from exampleapp.models import CreditGrantOutbox, WebhookOutbox
    from sqlalchemy import DDL, event

    from outboxkit.storage.notify import install_trigger_sql
    from tests.support.models import SampleEvent

    for outbox in (CreditGrantOutbox, WebhookOutbox, SampleEvent):
        for statement in install_trigger_sql(outbox):
            event.listen(outbox.__table__, "after_create", DDL(statement))


_install_notify_triggers()


# -- sample outbox rows (added for the drain invariant tests) ------------------


@pytest.fixture
def insert_events(engine: Engine, receiver: Receiver):
    """``insert_events(payloads, next_attempt_at=None) -> [id, ...]``: SampleEvent rows aimed at the receiver."""
    from sqlalchemy import insert

    from tests.support.models import SampleEvent

    def insert_events(
        payloads: list[dict], *, next_attempt_at: datetime | None = None, path: str = "/events"
    ) -> list[int]:
        values = [{"target_url": receiver.url + path, "payload": payload} for payload in payloads]
        if next_attempt_at is not None:
            for value in values:
                value["next_attempt_at"] = next_attempt_at
        statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
        with engine.begin() as connection:
            return list(connection.scalars(statement, values))

    return insert_events


@pytest.fixture
def read_events(engine: Engine):
    """``read_events() -> {id: SampleEvent}``: every SampleEvent row as it is now in the database."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from tests.support.models import SampleEvent

    def read_events() -> dict:
        with Session(engine) as session:
            return {row.id: row for row in session.scalars(select(SampleEvent).order_by(SampleEvent.id))}

    return read_events


@pytest.fixture
def make_drainer(engine: Engine, clock: ManualClock):
    """``make_drainer(engine=None, **option_overrides) -> Drainer`` for SampleEvent on the manual clock.

    Each drainer gets its own ``HttpTransport``; both are closed after the test.
    """
    import dataclasses

    from outboxkit import Drainer, HttpTransport
    from tests.support.models import SampleEvent

    made = []

    def make_drainer(drainer_engine: Engine | None = None, **option_overrides) -> Drainer:
        options = dataclasses.replace(SampleEvent.__outbox__, **option_overrides)
        transport = HttpTransport()
        drainer = Drainer(drainer_engine or engine, SampleEvent, transport=transport, clock=clock, options=options)
        made.append((drainer, transport))
        return drainer

    yield make_drainer
    for drainer, transport in made:
        drainer.close()
        transport.close()
