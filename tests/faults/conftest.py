"""Fixtures of the fault suite: one ``FaultScenario`` per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.faults.models import install_fault_schema
from tests.faults.scenario import FaultScenario, fault_seed
from tests.support.database import sqlalchemy_url
from tests.support.receiver import Receiver


@pytest.fixture
def fault_scenario(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Iterator[FaultScenario]:
    # pre-ping: scenario 3 terminates every session of the database, this pool's too.
    engine = create_engine(sqlalchemy_url(database_url), pool_size=3, max_overflow=2, pool_pre_ping=True)
    try:
        install_fault_schema(engine)
        with Receiver() as receiver:
            scenario = FaultScenario(
                database_url=database_url,
                engine=engine,
                receiver=receiver,
                log_dir=tmp_path / "logs",
                test_id=request.node.nodeid,
                seed=fault_seed(),
            )
            try:
                yield scenario
            finally:
                scenario.close()
    finally:
        engine.dispose()
