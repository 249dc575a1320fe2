"""Scenario 5, leader chaos: the leader is killed, cut off and frozen over and over; one holder, no double run.

Several scheduler processes (``tests/faults/scheduler_worker.py``: production
settings, 0.3 s tick and probe) campaign for the leader key while the
elected one drains the fault outbox and runs ``fault.heartbeat`` every 0.5 s.
In a seeded random order the scenario injects, to whichever process leads:

* ``kill``: SIGKILL (the fleet restarts it, as a process manager would);
* ``terminate``: ``pg_terminate_backend`` of its lock session (the one whose
  ``application_name`` starts with ``outboxkit-leader:``);
* ``pause``: SIGSTOP for longer than a tick, then SIGCONT.  Its lock session
  stays up, so nobody may take over;
* ``pause-dropped``: SIGSTOP, its lock session is terminated while it is
  frozen (a paused VM whose session the server dropped), a standby takes
  over, then SIGCONT: the old leader believes it leads until its next tick.
  That is the expected two-believer window; the fence keeps it harmless.

A sampler records the holder count (database-filtered ``pg_locks``) and each
process's belief every 100 ms.  Afterwards: the holder count never exceeded
1; every heartbeat occurrence ran at most once (``fault_heartbeat_runs``
has no repeated fire time and its fire times are at least one interval
apart); no process died but the killed ones; every row was delivered.
Published: failover p50/max (fault to the next acquisition) and the longest
window in which two processes believed they led.
"""

from __future__ import annotations

import signal
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from outboxkit.leader.election import current_leader
from outboxkit.storage.tables import job_runs
from tests.faults.fleet import WorkerFleet
from tests.faults.leadership import (
    LeadershipSampler,
    belief_intervals,
    current_believers,
    longest_overlap,
    terminate_leader_lock,
)
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.faults.scheduler_worker import HEARTBEAT_JOB_ID, heartbeat_runs
from tests.support.receiver import Reply

TICK = 0.3
PROBE = 0.3
HEARTBEAT = 0.5
FAULT_KINDS = ("kill", "terminate", "pause", "pause-dropped")


@dataclass(frozen=True)
class ChaosSize:
    variant: str
    workers: int
    cycles: int  # one fault of each kind per cycle, in a random order
    rows_per_fault: int = 10


SIZES = [
    pytest.param(ChaosSize("ci", workers=3, cycles=2), id="ci"),
    pytest.param(ChaosSize("long", workers=5, cycles=20), id="long", marks=LONG_VARIANT),
]


class Chaos:
    """Injects faults into whichever process leads and remembers what it did, when."""

    def __init__(self, scenario: FaultScenario, fleet: WorkerFleet) -> None:
        self.scenario = scenario
        self.fleet = fleet
        self.paused: set[str] = set()
        self.pauses: dict[int, list[tuple[float, float]]] = {}
        self.failovers: list[float] = []
        self.faults: list[str] = []

    def leader(self) -> str:
        """Wait until exactly one live process believes it leads and it holds the key; its name.

        Both, because a leader whose lock was just taken away (the previous fault) still believes it
        leads until its next tick, while the new holder is promoting: a fault aimed at the believer
        alone would hit a process that no longer leads, and no new leader would follow it.
        """
        believers: tuple[str, ...] = ()

        def settled() -> bool:
            nonlocal believers
            believers = current_believers(self.fleet, lambda: self.paused)
            if len(believers) != 1:
                return False
            pid = self.fleet.current_pid(believers[0])
            holder = current_leader(self.scenario.engine)
            return pid is not None and holder is not None and holder.pid == pid

        self.scenario.wait_until(settled, timeout=30, what="exactly one process leading", every=0.02)
        return believers[0]

    def acquired_after(self, moment: float, *, excluding: int | None = None) -> float | None:
        """When the first process (other than ``excluding``) acquired the key after ``moment``."""
        times = [
            event["at"]
            for event in self.fleet.events("role")
            if event["role"] == "promoting" and event["at"] > moment and event["pid"] != excluding
        ]
        return min(times, default=None)

    def wait_new_leader(self, moment: float, *, excluding: int | None = None) -> float:
        what = "a process acquiring the leader key after the fault"
        self.scenario.wait_until(
            lambda: self.acquired_after(moment, excluding=excluding) is not None, timeout=30, what=what, every=0.02
        )
        acquired = self.acquired_after(moment, excluding=excluding)
        assert acquired is not None
        self.failovers.append(acquired - moment)
        return acquired

    def inject(self, kind: str) -> None:
        leader = self.leader()
        pid = self.fleet.current_pid(leader)
        assert pid is not None
        self.faults.append(kind)
        if kind == "kill":
            moment = time.time()
            assert self.fleet.kill(leader) == pid
            self.wait_new_leader(moment, excluding=pid)
        elif kind == "terminate":
            moment = time.time()
            assert terminate_leader_lock(self.scenario.database_url) is not None, "no lock session to terminate"
            self.wait_new_leader(moment)
        else:
            self.pause(leader, pid, dropped=kind == "pause-dropped")

    def pause(self, leader: str, pid: int, *, dropped: bool) -> None:
        self.paused.add(leader)
        self.fleet.send_signal(leader, signal.SIGSTOP)
        stopped_at = time.time()
        try:
            if dropped:
                assert terminate_leader_lock(self.scenario.database_url) is not None, "no lock session to terminate"
                self.wait_new_leader(stopped_at, excluding=pid)
                # The old leader wakes only after the new one has run an occurrence it has missed.
                runs = len(heartbeat_fire_times(self.scenario))
                self.scenario.wait_until(
                    lambda: len(heartbeat_fire_times(self.scenario)) > runs,
                    timeout=10,
                    what="the new leader running the heartbeat",
                    every=0.02,
                )
            else:
                time.sleep(TICK * self.scenario.random.uniform(2, 4))  # the length of the freeze is the fault
        finally:
            self.fleet.send_signal(leader, signal.SIGCONT)
            resumed_at = time.time()
            self.paused.discard(leader)
            self.pauses.setdefault(pid, []).append((stopped_at, resumed_at))
        if dropped:
            self.scenario.wait_until(
                lambda: self._role_of(leader, pid) != "leader", timeout=10, what="the resumed old leader stepping down"
            )

    def _role_of(self, name: str, pid: int) -> str | None:
        roles = [event["role"] for event in self.fleet.events("role", name=name) if event["pid"] == pid]
        return roles[-1] if roles else None


def heartbeat_fire_times(scenario: FaultScenario) -> list:
    with scenario.engine.connect() as connection:
        return list(connection.scalars(select(heartbeat_runs.c.scheduled_for).order_by(heartbeat_runs.c.scheduled_for)))


def fence_duplicates(scenario: FaultScenario) -> int:
    repeated = (
        select(job_runs.c.scheduled_for)
        .where(job_runs.c.job_id == HEARTBEAT_JOB_ID)
        .group_by(job_runs.c.scheduled_for)
        .having(func.count() > 1)
    )
    with scenario.engine.connect() as connection:
        return len(connection.execute(repeated).all())


def fence_skips(fleet: WorkerFleet) -> int:
    """Occurrences a scheduler skipped because another had taken them (the fence at work), from the logs."""
    return sum(
        path.read_text(errors="replace").count("was already taken by another scheduler")
        for path in fleet.log_dir.glob("*.log")
    )


@pytest.mark.parametrize("size", SIZES)
def test_leader_chaos_keeps_one_holder_and_runs_no_occurrence_twice(
    fault_scenario: FaultScenario, size: ChaosSize
) -> None:
    scenario = fault_scenario
    log = scenario.listen(lambda arrival: Reply(status=200, delay=0.005))
    names = [f"outboxkit-fault-scheduler-{index}" for index in range(1, size.workers + 1)]
    kinds = [kind for _ in range(size.cycles) for kind in scenario.random.sample(FAULT_KINDS, len(FAULT_KINDS))]
    with scenario.scheduler_fleet(tick=TICK, probe=PROBE, drain_interval=1.0, restart=True) as fleet:
        chaos = Chaos(scenario, fleet)
        fleet.start(names)
        with LeadershipSampler(scenario.database_url, fleet, paused=lambda: set(chaos.paused)) as sampler:
            for kind in kinds:
                scenario.insert(["ok"] * size.rows_per_fault)
                chaos.inject(kind)
                time.sleep(scenario.random.uniform(0.1, 0.4))  # a random gap before the next fault
            chaos.leader()
            scenario.wait_settled(timeout=60)
            first_fire_times = len(heartbeat_fire_times(scenario))
            scenario.wait_until(
                lambda: len(heartbeat_fire_times(scenario)) >= first_fire_times + 2,
                timeout=30,
                what="the heartbeat running under the last leader",
            )

    context = scenario.context
    assert sampler.samples, f"the sampler took no sample ({context})"
    assert sampler.max_holders() == 1, f"holder count reached {sampler.max_holders()} ({context})"
    deaths = fleet.deaths()
    assert [death for death in deaths if death.returncode != -9] == [], f"a scheduler crashed: {deaths} ({context})"
    assert len(deaths) == kinds.count("kill"), f"expected {kinds.count('kill')} kills, saw {deaths} ({context})"

    fire_times = heartbeat_fire_times(scenario)
    assert fire_times, f"the heartbeat never ran ({context})"
    repeated = len(fire_times) - len(set(fire_times))
    assert repeated == 0, f"{repeated} heartbeat occurrence(s) ran twice ({context})"
    assert fence_duplicates(scenario) == 0
    closest = min((b - a for a, b in zip(fire_times, fire_times[1:], strict=False)), default=timedelta(seconds=HEARTBEAT))
    assert closest >= timedelta(seconds=HEARTBEAT), f"two heartbeat runs {closest} apart ({context})"

    ledger = scenario.ledger(log)
    ledger.assert_invariants(context)
    assert set(ledger.received) == ledger.keys(), f"rows never delivered ({context})"

    window = longest_overlap(belief_intervals(fleet, chaos.pauses))
    scenario.publish(
        scenario="leader-chaos",
        title="5. leader chaos",
        variant=size.variant,
        faults=(
            f"{len(kinds)} faults to the leader of {size.workers} schedulers: {size.cycles} each of SIGKILL, "
            "lock session terminated, SIGSTOP > tick, SIGSTOP with its lock session terminated meanwhile"
        ),
        fault_count=len(kinds),
        ledger=ledger,
        max_holders=sampler.max_holders(),
        failover_p50=round(statistics.median(chaos.failovers), 3),
        failover_max=round(max(chaos.failovers), 3),
        two_believer_window=round(window, 3),
        samples=len(sampler.samples),
        most_believers_sampled=sampler.max_sampled_believers(),
        heartbeat_runs=len(fire_times),
        fence_skips=fence_skips(fleet),
        leader_tick=TICK,
    )
