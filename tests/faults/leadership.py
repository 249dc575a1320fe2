"""Watching and breaking the election from the fault side.

``LeadershipSampler`` samples, every 100 ms, how many sessions hold the
leader key in the scenario's database (``pg_locks`` with the database
predicate, through ``outboxkit.leader.election.lock_holders``) and which scheduler
processes believe they lead (their latest ``role`` event, read through the
fleet).  ``belief_intervals`` and ``longest_overlap`` rebuild the same beliefs
exactly from the events, which the window figure uses: a sample every 100 ms
would miss a window of a few milliseconds.

``terminate_every_backend`` is how the suite injects a database restart: it
ends every session of the test database but its own, which is what a restart
looks like to the clients (the server itself is shared and stays up).
``terminate_leader_lock`` ends only the session that holds the leader key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from sqlalchemy import create_engine

from outboxkit.leader.election import APPLICATION_NAME_PREFIX, lock_holders
from tests.faults.fleet import WorkerFleet
from tests.support.database import sqlalchemy_url

__all__ = [
    "LeadershipSampler",
    "Sample",
    "belief_intervals",
    "longest_overlap",
    "terminate_every_backend",
    "terminate_leader_lock",
]


def terminate_every_backend(database_url: str, *, timeout: float = 10.0) -> int:
    """End every session of this database except the caller's, wait until they are gone; return how many."""
    with psycopg.connect(database_url, autocommit=True, application_name="outboxkit-fault-restart") as connection:
        row = connection.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %s)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
            [int(timeout * 1000)],
        ).fetchone()
    assert row is not None
    return int(row[0])


def terminate_leader_lock(database_url: str, *, timeout: float = 10.0) -> int | None:
    """End the session holding the leader key (its application_name starts with the leader prefix).

    Returns its backend pid, or None when no such session holds the key.
    """
    with psycopg.connect(database_url, autocommit=True, application_name="outboxkit-fault-terminator") as connection:
        row = connection.execute(
            "SELECT a.pid, pg_terminate_backend(a.pid, %s) FROM pg_locks AS l JOIN pg_stat_activity AS a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND left(a.application_name, %s) = %s",
            [int(timeout * 1000), len(APPLICATION_NAME_PREFIX), APPLICATION_NAME_PREFIX],
        ).fetchone()
    return None if row is None else int(row[0])


@dataclass(frozen=True)
class Sample:
    at: float  # time.time()
    holders: int | None  # None: the database could not be asked (e.g. during an injected restart)
    believers: tuple[str, ...]  # names whose running, unpaused process says it leads


def current_believers(fleet: WorkerFleet, paused: Callable[[], set[str]]) -> tuple[str, ...]:
    """Names whose live, unpaused process last said ``leader``."""
    believers = []
    frozen = paused()
    for name in fleet.names:
        pid = fleet.current_pid(name)
        if pid is None or name in frozen:
            continue
        roles = [event for event in fleet.events("role", name=name) if event["pid"] == pid]
        if roles and roles[-1]["role"] == "leader":
            believers.append(name)
    return tuple(believers)


class LeadershipSampler(threading.Thread):
    """Samples the holder count and the believers every ``every`` seconds until ``stop()``."""

    def __init__(
        self, database_url: str, fleet: WorkerFleet, *, paused: Callable[[], set[str]] = set, every: float = 0.1
    ) -> None:
        super().__init__(name="fault-leadership-sampler", daemon=True)
        self.engine = create_engine(
            sqlalchemy_url(database_url),
            pool_size=1,
            max_overflow=0,
            pool_pre_ping=True,
            connect_args={"application_name": "outboxkit-fault-sampler"},
        )
        self.fleet = fleet
        self.paused = paused
        self.every = every
        self.samples: list[Sample] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.every):
            try:
                with self.engine.connect() as connection:
                    holders: int | None = len(lock_holders(connection))
            except Exception:  # the sampler's own session was terminated with the rest: count it unknown
                holders = None
            self.samples.append(Sample(time.time(), holders, current_believers(self.fleet, self.paused)))

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)
        self.engine.dispose()

    def __enter__(self) -> LeadershipSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def max_holders(self) -> int:
        return max((sample.holders for sample in self.samples if sample.holders is not None), default=0)

    def max_sampled_believers(self) -> int:
        return max((len(sample.believers) for sample in self.samples), default=0)

    def holders_since(self, moment: float) -> list[int | None]:
        return [sample.holders for sample in self.samples if sample.at >= moment]


def belief_intervals(fleet: WorkerFleet, pauses: dict[int, list[tuple[float, float]]]) -> list[tuple[int, float, float]]:
    """(pid, from, to) for every span in which a process believed it led and could act on it.

    A span runs from a ``leader`` event to the process's next role event or
    its exit (or now); the time it spent stopped (``pauses[pid]``: SIGSTOP to
    SIGCONT) is cut out, since a frozen process fires nothing.
    """
    exits = {exit.pid: exit.at for exit in fleet.exits}
    by_pid: dict[int, list[dict]] = {}
    for event in fleet.events("role"):
        by_pid.setdefault(event["pid"], []).append(event)
    spans = []
    for pid, events in by_pid.items():
        for event, following in zip(events, [*events[1:], None], strict=False):
            if event["role"] != "leader":
                continue
            end = following["at"] if following is not None else exits.get(pid, time.time())
            spans += [(pid, start, stop) for start, stop in _cut(event["at"], end, pauses.get(pid, []))]
    return spans


def _cut(start: float, end: float, pauses: list[tuple[float, float]]) -> list[tuple[float, float]]:
    pieces = [(start, end)]
    for paused_at, resumed_at in pauses:
        pieces = [
            piece
            for begin, finish in pieces
            for piece in ((begin, min(finish, paused_at)), (max(begin, resumed_at), finish))
            if piece[1] > piece[0]
        ]
    return pieces


def longest_overlap(spans: list[tuple[int, float, float]]) -> float:
    """The longest time two different processes' belief spans overlapped (0.0 if never)."""
    longest = 0.0
    for index, (pid, start, end) in enumerate(spans):
        for other_pid, other_start, other_end in spans[index + 1 :]:
            if other_pid != pid:
                longest = max(longest, min(end, other_end) - max(start, other_start))
    return longest
