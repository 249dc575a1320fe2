"""The start-up pooler checks never hold up a start on a database that does not answer.

A socket on 127.0.0.1 that accepts connections and never says a word stands
in for a dead network path: a connect to it waits for ever (the engine sets
no connect timeout).  The checks give up after ``CHECK_SECONDS`` with a
warning, and the election and the drain loops start as they would without
them.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.drain import pooler_checks
from outboxkit.leader.election import ElectionState
from tests.support.models import SampleEvent


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A URL whose server accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"postgresql+psycopg://root@127.0.0.1:{listener.getsockname()[1]}/silent"


def test_a_database_that_does_not_answer_does_not_hold_up_the_start(silent_server, monkeypatch, caplog):
    monkeypatch.setattr(pooler_checks, "CHECK_SECONDS", 0.5)
    engine = create_engine(silent_server)
    settings = OutboxKitSettings(environment="production", leader_tick_seconds=3600, standby_probe_seconds=3600)
    kit = OutboxKit(engine, [SampleEvent], settings=settings)
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit.drain.pooler_checks"):
            election = kit.scheduler.elect()  # returns: neither the engine nor the lock source could be checked
        assert election.state in (ElectionState.STANDBY, ElectionState.PROMOTING)
        gave_up = [record.getMessage() for record in caplog.records]
        assert any("could not check the engine" in message for message in gave_up)
        assert any("could not check the leader lock connection" in message for message in gave_up)
    finally:
        election.stop(timeout=0)
        engine.dispose()


def test_a_check_that_could_not_tell_decides_nothing_and_the_next_start_checks_again(silent_server, monkeypatch, caplog):
    monkeypatch.setattr(pooler_checks, "CHECK_SECONDS", 0.5)
    engine = create_engine(silent_server)
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(environment="production"))
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit.drain.pooler_checks"):
            pooler_checks.check_engine(kit)
            assert not kit.pooler_verdict.engine_decided, "no answer is no verdict"
            pooler_checks.check_engine(kit)  # as the election's start after the worker's: it looks again
        gave_up = [record for record in caplog.records if "could not check the engine" in record.getMessage()]
        assert len(gave_up) == 2 and kit.pooler_verdict.refusal is None
    finally:
        kit.close()
        engine.dispose()


def test_a_database_that_refuses_connections_decides_nothing_either():
    with socket.socket() as probe:  # a port nothing listens on: every connect is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = create_engine(f"postgresql+psycopg://root@127.0.0.1:{port}/refused")
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(environment="production"))
    try:
        pooler_checks.check_engine(kit)
        assert pooler_checks.session_source_accepted(kit, "outboxkit-test", purpose="the LISTEN connection")
        assert not kit.pooler_verdict.engine_decided and kit.pooler_verdict.session_source_accepted is None
        assert kit.pooler_verdict.refusal is None
    finally:
        kit.close()
        engine.dispose()
