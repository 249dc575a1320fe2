"""The pump's held connection (``drain_record.OutcomeConnection``): a step runs on it, and once more on a fresh
one only when the held connection is found broken.

The pump's claim relies on it after a server restart or an idle timeout: tests/integration/test_worker.py
(``test_a_loop_whose_held_connection_died_while_idle_claims_on_a_fresh_one``) drives that end to end.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from outboxkit.drain.record import OutcomeConnection
from outboxkit.storage.drain_queries import OutboxQueries
from tests.support.models import SampleEvent


class Step:
    """A step that counts its runs, records the backend of each that reached one, and raises ``failures`` (in
    order) before it succeeds."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.runs = 0
        self.backends: list[int] = []

    def __call__(self, connection: Connection) -> str:
        self.runs += 1
        self.backends.append(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
        if self.failures:
            raise self.failures.pop(0)
        return "claimed"


def backend_of(outcomes: OutcomeConnection) -> int:
    held = outcomes.held
    assert held is not None
    return held.execute(text("SELECT pg_backend_pid()")).scalar_one()


def terminate(database_url: str, backend: int) -> None:
    """As a server restart or an idle timeout does: the session ends while its client does not look."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [backend])


def test_a_step_on_a_live_connection_runs_once_and_its_failure_is_raised(engine: Engine):
    with contextlib.ExitStack() as cleanup:
        outcomes = OutcomeConnection(OutboxQueries(SampleEvent), engine, cleanup)
        assert outcomes.run_reconnecting(Step()) == "claimed"
        held = backend_of(outcomes)
        failing = Step(RuntimeError("the claim failed"))
        with pytest.raises(RuntimeError, match="the claim failed"):
            outcomes.run_reconnecting(failing)
        assert (failing.runs, failing.backends) == (1, [held])  # not run again: the connection was fine
        assert backend_of(outcomes) == held  # and it is still the one held


def test_a_held_connection_found_broken_is_replaced_and_the_step_runs_once_more(engine: Engine, database_url: str):
    with contextlib.ExitStack() as cleanup:
        outcomes = OutcomeConnection(OutboxQueries(SampleEvent), engine, cleanup)
        outcomes.get()
        dead = backend_of(outcomes)
        terminate(database_url, dead)
        step = Step()
        assert outcomes.run_reconnecting(step) == "claimed"
        assert step.runs == 2  # the first run failed on the dead connection
        assert len(step.backends) == 1 and step.backends[0] != dead
        assert backend_of(outcomes) == step.backends[0]  # the fresh connection is the one held now

        # Broken again, and the second run fails too: that failure is raised, not retried further.
        terminate(database_url, step.backends[0])
        failing = Step(RuntimeError("the claim failed on the fresh connection"))
        with pytest.raises(RuntimeError, match="on the fresh connection") as raised:
            outcomes.run_reconnecting(failing)
        assert failing.runs == 2
        assert isinstance(raised.value.__context__, DBAPIError)  # the dead connection's error, chained
