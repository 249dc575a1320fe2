"""One fault scenario's world, shared by every scenario of the suite.

A ``FaultScenario`` (the ``fault_scenario`` fixture) owns a fresh database
holding the fault outbox and its history trigger, a real receiver on
127.0.0.1, the worker fleets it starts, and a random source seeded from
``OUTBOXKIT_FAULT_SEED`` (default ``DEFAULT_SEED``) and the test's name, so a
failing run replays with the seed its message prints.  Scenarios inject
their faults, wait for the end state with ``wait_until`` (polls with a
deadline), read it back as a ``Ledger`` and ``publish`` their figures.
Everything it started is stopped in ``close()``, even when the test fails.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select, text

from tests.faults.arrivals import Arrival, ArrivalLog
from tests.faults.figures import ScenarioFigures
from tests.faults.fleet import WorkerFleet, drain_worker_command, scheduler_worker_command, worker_environment
from tests.faults.ledger import Ledger
from tests.faults.models import FaultBase, FaultEvent
from tests.faults.postgres import DatabaseClock, SessionTerminator
from tests.faults.scheduler_worker import install_heartbeat_table
from tests.support.database import sqlalchemy_url
from tests.support.receiver import Receiver, Reply

__all__ = ["DEFAULT_SEED", "LONG_VARIANT", "SEED_VARIABLE", "FaultScenario"]

SEED_VARIABLE = "OUTBOXKIT_FAULT_SEED"
# Marks of a scenario's long variant: kept out of CI (pytest -m slow runs it),
# with room beyond the suite's default per-test timeout.
LONG_VARIANT = (pytest.mark.slow, pytest.mark.timeout(900))
DEFAULT_SEED = 20261129


def fault_seed() -> int:
    value = os.environ.get(SEED_VARIABLE, "").strip()
    if not value:
        return DEFAULT_SEED
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None


class FaultScenario:
    """A database, a receiver, worker fleets and a seeded random source for one scenario."""

    def __init__(
        self, *, database_url: str, engine: Engine, receiver: Receiver, log_dir: Path, test_id: str, seed: int
    ) -> None:
        self.database_url = database_url  # libpq form
        self.engine = engine
        self.receiver = receiver
        self.log_dir = log_dir
        self.test_id = test_id
        self.seed = seed
        self.random = random.Random(f"{seed}/{test_id}")
        self.started = time.monotonic()
        self._fleets: list[WorkerFleet] = []
        self._closers: list[Callable[[], None]] = []
        print(f"fault scenario {test_id}: seed {seed} (replay: {self.replay_command})")

    @property
    def replay_command(self) -> str:
        return f"{SEED_VARIABLE}={self.seed} .venv/bin/python -m pytest '{self.test_id}' -m 'slow or not slow'"

    @property
    def context(self) -> str:
        """What a failure message needs to be replayed and investigated."""
        return f"seed {self.seed}; replay: {self.replay_command}; worker logs in {self.log_dir}"

    # -- the pieces ----------------------------------------------------------

    def fleet(self, *, restart: bool = False, settings: dict[str, object] | None = None) -> WorkerFleet:
        """A fleet of drain workers on this database; ``settings`` override the fault outbox's options."""
        overrides = {
            f"OUTBOXKIT_OUTBOXES__FAULT_EVENTS__{name.upper()}": ",".join(map(str, value))
            if isinstance(value, (tuple, list))
            else str(value)
            for name, value in (settings or {}).items()
        }
        fleet = WorkerFleet(
            drain_worker_command(sqlalchemy_url(self.database_url)),
            log_dir=self.log_dir / f"fleet-{len(self._fleets) + 1}",
            environment=worker_environment(overrides),
            restart=restart,
        )
        self._fleets.append(fleet)
        return fleet

    def scheduler_fleet(
        self, *, tick: float, probe: float, drain_interval: float, restart: bool = False
    ) -> WorkerFleet:
        """A fleet of elected scheduler processes (``tests/faults/scheduler_worker.py``) on this database."""
        install_heartbeat_table(self.engine)
        fleet = WorkerFleet(
            scheduler_worker_command(
                sqlalchemy_url(self.database_url), tick=tick, probe=probe, drain_interval=drain_interval
            ),
            log_dir=self.log_dir / f"fleet-{len(self._fleets) + 1}",
            restart=restart,
        )
        self._fleets.append(fleet)
        return fleet

    def listen(self, respond: Callable[[Arrival], Reply], *, database_clock: bool = False) -> ArrivalLog:
        """Answer the receiver's requests with ``respond`` and log each arrival."""
        clock = None
        if database_clock:
            clock = DatabaseClock(self.database_url)
            self._closers.append(clock.close)
        return ArrivalLog(self.receiver, respond, clock=clock)

    def terminator(self) -> SessionTerminator:
        terminator = SessionTerminator(self.database_url)
        self._closers.append(terminator.close)
        return terminator

    def refusing_url(self) -> str:
        """A URL on 127.0.0.1 whose port is bound but not listening: every connection is refused."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # held, never listened on, so no one else gets the port
        self._closers.append(sock.close)
        return f"http://127.0.0.1:{sock.getsockname()[1]}/refused"

    # -- rows ----------------------------------------------------------------

    def insert(self, behaviours: Sequence[str], *, url: str | None = None) -> list[str]:
        """Insert one row per behaviour, in one transaction; return their idempotency keys in order."""
        if not behaviours:
            return []
        target = url or f"{self.receiver.url}/events"
        table = FaultBase.metadata.tables[FaultEvent.__tablename__]  # a Table: FaultEvent.__table__ is typed FromClause
        statement = insert(table).returning(table.c.idempotency_key, sort_by_parameter_order=True)
        with self.engine.begin() as connection:
            keys = connection.scalars(statement, [{"target_url": target, "behaviour": b} for b in behaviours]).all()
        return [str(key) for key in keys]

    def count(self, status: str | None = None) -> int:
        table = FaultEvent.__table__
        query = select(func.count()).select_from(table)
        if status is not None:
            query = query.where(table.c.status == status)
        with self.engine.connect() as connection:
            return int(connection.scalar(query) or 0)

    # -- waiting and reading -------------------------------------------------

    def wait_until(self, condition: Callable[[], bool], *, timeout: float, what: str, every: float = 0.1) -> None:
        """Poll ``condition`` until it holds; fail with ``what`` and the replay context after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached within {timeout:g}s: {what} ({self.context}){self.lock_waits()}")
            time.sleep(every)

    def lock_waits(self) -> str:
        """The sessions of this database waiting on a lock and what their blockers run, for a failure message."""
        query = text(
            """
            SELECT waiting.application_name, left(waiting.query, 160), blocker.application_name, blocker.state,
                   left(blocker.query, 160)
            FROM pg_stat_activity waiting
            LEFT JOIN pg_stat_activity blocker ON blocker.pid = (pg_blocking_pids(waiting.pid))[1]
            WHERE waiting.datname = current_database() AND waiting.wait_event_type = 'Lock'
            """
        )
        try:
            with self.engine.connect() as connection:
                rows = connection.execute(query).all()
        except Exception as exc:  # the server may be the fault: the message says so instead
            return f"; lock waits unknown ({type(exc).__name__})"
        if not rows:
            return "; no session waits on a lock"
        return "; lock waits: " + "; ".join(
            f"{name} running {statement!r} waits on {blocker} ({state}: {held!r})"
            for name, statement, blocker, state, held in rows
        )

    def wait_settled(self, *, timeout: float) -> None:
        """Wait until no row is pending (every row done or stuck)."""
        self.wait_until(lambda: self.count("pending") == 0, timeout=timeout, what="every row done or stuck")

    def ledger(self, log: ArrivalLog) -> Ledger:
        return Ledger.read(self.engine, log.arrivals())

    def publish(
        self,
        *,
        scenario: str,
        title: str,
        variant: str,
        faults: str,
        fault_count: int,
        ledger: Ledger,
        lost: int | None = None,
        max_holders: int | None = None,
        failover_p50: float | None = None,
        failover_max: float | None = None,
        two_believer_window: float | None = None,
        **details: Any,
    ) -> ScenarioFigures:
        """Print (and write, for the report) the figures; ``lost`` defaults to ``ledger.lost()``.

        The election figures stay None (rendered "n/a") for scenarios without a scheduler.
        """
        figures = ScenarioFigures(
            scenario=scenario,
            title=title,
            variant=variant,
            faults=faults,
            fault_count=fault_count,
            rows=len(ledger.rows),
            lost=ledger.lost() if lost is None else lost,
            duplicates=ledger.duplicates(),
            seed=self.seed,
            seconds=round(time.monotonic() - self.started, 1),
            command=self.replay_command,
            max_holders=max_holders,
            failover_p50=failover_p50,
            failover_max=failover_max,
            two_believer_window=two_believer_window,
            details={"statuses": dict(ledger.statuses()), **details},
        )
        figures.publish()
        return figures

    def close(self) -> None:
        for fleet in self._fleets:
            fleet.stop()
        for closer in reversed(self._closers):
            closer()
