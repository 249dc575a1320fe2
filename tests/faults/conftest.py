"""Fixtures of the fault suite: one ``FaultScenario`` per test; a private PostgreSQL cluster for the tests that restart it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine

from tests.faults.models import install_fault_schema
from tests.faults.private_server import PrivateServer, postgres_binaries
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


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A PostgreSQL cluster of the test's own (which it may crash or restart) holding an empty database ``crash``."""
    binaries = postgres_binaries()
    if binaries is None:
        pytest.skip("needs PostgreSQL's initdb and pg_ctl (/usr/lib/postgresql/*/bin)")
    server = PrivateServer(binaries)
    try:
        server.start()
        with psycopg.connect(server.url, autocommit=True) as connection:
            connection.execute("CREATE DATABASE crash")
        yield server
    finally:
        server.stop()
