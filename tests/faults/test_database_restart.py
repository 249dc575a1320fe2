"""Scenario 3, database restart mid-drain: every session drops at once; the schedulers recover by themselves.

Scheduler processes (``tests/faults/scheduler_worker.py``: each an OutboxKit
with ``kit.scheduler.elect()``, production settings, 0.3 s tick and probe,
a NOTIFY trigger on the fault outbox) drain rows into the real receiver.
While the leader is draining, the scenario ends *every* session of the test
database but its own (``pg_terminate_backend`` on all of them).  That is
what a server restart looks like to the clients: the lock session, the
LISTEN session and every pooled connection die at once.  The suite does not
restart the PostgreSQL server itself, which other test runs share.

After each restart: exactly one process re-acquires the leader key (the
database-filtered holder count comes back to 1 and is never 2), the new
leader's NOTIFY listener LISTENs again, and draining goes on.  At the end:
every process is still alive, each logged a bounded number of
reconnect/demotion lines (no crash loop), every row is done, no ``done``
row ever went back to ``pending`` (the row-history trigger), and the
ledger's invariants hold.
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from dataclasses import dataclass

import pytest

from outboxkit.storage.notify import install_trigger_sql
from tests.faults.arrivals import Arrival
from tests.faults.fleet import WorkerFleet
from tests.faults.leadership import (
    LeadershipSampler,
    belief_intervals,
    current_believers,
    longest_overlap,
    terminate_every_backend,
)
from tests.faults.models import FaultEvent
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.support.receiver import Reply

TICK = 0.3
PROBE = 0.3
# Log lines of a session coming back: the listener's reconnects and the election's demotions.
RECONNECT_LINE = re.compile(r"listener lost its connection|listener cannot connect|listener reconnected|lost leadership")
# Per process and per restart: a demotion, a listener drop and its reconnect, with room for one retry each.
RECONNECT_LINES_PER_RESTART = 6


@dataclass(frozen=True)
class RestartSize:
    variant: str
    restarts: int
    rows_per_restart: int
    workers: int = 3


SIZES = [
    pytest.param(RestartSize("ci", restarts=4, rows_per_restart=300), id="ci"),
    pytest.param(RestartSize("long", restarts=20, rows_per_restart=500), id="long", marks=LONG_VARIANT),
]


def receiver_latency(arrival: Arrival) -> Reply:
    """5-20 ms, fixed per key, so the drains are busy when the sessions die."""
    digest = hashlib.blake2b((arrival.key or "").encode(), digest_size=2).digest()
    return Reply(status=200, delay=0.005 + int.from_bytes(digest, "big") % 16 / 1000)


def reconnect_lines(fleet: WorkerFleet) -> dict[str, int]:
    """Reconnect/demotion log lines per worker log file."""
    return {
        path.name: sum(1 for line in path.read_text(errors="replace").splitlines() if RECONNECT_LINE.search(line))
        for path in sorted(fleet.log_dir.glob("*.log"))
    }


@pytest.mark.parametrize("size", SIZES)
def test_database_restart_mid_drain_recovers_with_one_leader_and_loses_nothing(
    fault_scenario: FaultScenario, size: RestartSize
) -> None:
    scenario = fault_scenario
    with scenario.engine.begin() as connection:
        for statement in install_trigger_sql(FaultEvent):
            connection.exec_driver_sql(statement)
    log = scenario.listen(receiver_latency)
    names = [f"outboxkit-fault-scheduler-{index}" for index in range(1, size.workers + 1)]
    terminated: list[int] = []
    failovers: list[float] = []

    with scenario.scheduler_fleet(tick=TICK, probe=PROBE, drain_interval=1.0) as fleet:
        fleet.start(names)
        with LeadershipSampler(scenario.database_url, fleet) as sampler:
            for _ in range(size.restarts):
                scenario.wait_settled(timeout=60)  # each restart hits a fresh chunk, not a growing backlog
                scenario.wait_until(lambda: len(current_believers(fleet, set)) == 1, timeout=30, what="one process leading")
                done_before = scenario.count("done")
                scenario.insert(["ok"] * size.rows_per_restart)
                # Mid-drain: the leader has delivered some of the new rows and has more to go.
                target = done_before + scenario.random.randint(size.rows_per_restart // 10, size.rows_per_restart // 2)
                scenario.wait_until(
                    lambda target=target: scenario.count("done") >= target, timeout=30, what="the drain under way", every=0.02
                )
                moment = time.time()
                terminated.append(terminate_every_backend(scenario.database_url))
                failovers.append(wait_for_recovery(scenario, fleet, sampler, moment))
            scenario.wait_settled(timeout=60)

    context = scenario.context
    assert fleet.deaths() == [], f"a scheduler process died: {fleet.deaths()} ({context})"
    assert sampler.max_holders() == 1, f"holder count reached {sampler.max_holders()} ({context})"
    lines = reconnect_lines(fleet)
    assert all(count <= RECONNECT_LINES_PER_RESTART * size.restarts for count in lines.values()), (
        f"reconnect lines per process {lines}: a crash loop? ({context})"
    )
    ledger = scenario.ledger(log)
    ledger.assert_invariants(context)
    assert ledger.statuses() == {"done": size.rows_per_restart * size.restarts}, f"{ledger.statuses()} ({context})"
    assert not ledger.reopened_done_rows(), f"done rows back to pending: {ledger.reopened_done_rows()[:5]} ({context})"

    scenario.publish(
        scenario="database-restart",
        title="3. database restart mid-drain",
        variant=size.variant,
        faults=(
            f"{size.restarts} x every session of the database terminated mid-drain "
            f"(how a restart looks to clients), {size.workers} schedulers"
        ),
        fault_count=size.restarts,
        ledger=ledger,
        max_holders=sampler.max_holders(),
        failover_p50=round(statistics.median(failovers), 3),
        failover_max=round(max(failovers), 3),
        two_believer_window=round(longest_overlap(belief_intervals(fleet, {})), 3),
        sessions_terminated=sum(terminated),
        reconnect_lines=sum(lines.values()),
        interrupted_claims=ledger.interrupted_claims(),
    )


def wait_for_recovery(scenario: FaultScenario, fleet: WorkerFleet, sampler: LeadershipSampler, moment: float) -> float:
    """Wait until one process holds the key again and its listener LISTENs again; return the failover time."""

    def acquisitions() -> list[float]:
        return [event["at"] for event in fleet.events("role") if event["role"] == "promoting" and event["at"] > moment]

    scenario.wait_until(acquisitions, timeout=30, what="a process re-acquiring the leader key", every=0.02)
    scenario.wait_until(lambda: 1 in sampler.holders_since(moment), timeout=30, what="the holder count back to 1", every=0.02)

    def listening_again() -> bool:
        believers = current_believers(fleet, set)
        if len(believers) != 1:
            return False
        pid = fleet.current_pid(believers[0])
        return any(event["pid"] == pid and event["at"] > moment for event in fleet.events("listening"))

    scenario.wait_until(listening_again, timeout=30, what="the new leader's listener LISTENing again", every=0.02)
    return min(acquisitions()) - moment
