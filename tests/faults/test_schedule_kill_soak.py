"""Schedules: three processes, one of them SIGKILLed or cut off from the database every few seconds.

Three ``schedule_worker`` processes (restarted when killed, as a process
manager would) fire three schedules of two seconds (grace 60 s; each run
takes 0.5 s under a 4 s lease, so faults land mid-run as well as mid-claim
and between).  Each process holds one run at a time, so at a fire time each
one awake claims one schedule and leaves the others to the rest.  At seeded
random moments a random ready process gets either SIGKILL or every one of
its sessions terminated (``pg_terminate_backend`` on its pool's and its
LISTEN session's), in a seeded order in which every two faults in a row are
one of each.  After the last fault every process fires again by itself.

The checks (``ScheduleLedger``): no occurrence ran twice; none is recorded
``missed`` and every fire time ran or coalesced into a later run within the
grace (a killed holder's schedule waits for its lease to expire, then its
waiting occurrences run once); no run started before its fire time; no
schedule's runs overlapped.  A run whose process was killed mid-run is
``abandoned`` (at most once: not run again); their count is printed.

The CI variant runs 6 s with a fault every 0.5-1.5 s (at least four faults,
so two kills and two cut connections at least); the long one is the issue's
120 s with a fault every 10 s (``pytest -m slow``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import pytest

from tests.faults.fleet import WorkerFleet
from tests.faults.postgres import DatabaseClock, SessionTerminator
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.faults.schedule_ledger import ScheduleLedger, install_schedules
from tests.faults.schedule_worker import schedule_worker_command
from tests.support.database import sqlalchemy_url

PERIOD, GRACE, SCHEDULES = 2.0, 60.0, 3
WORKERS = ["schedules-1", "schedules-2", "schedules-3"]


@dataclass(frozen=True)
class SoakSize:
    variant: str
    seconds: float
    fault_gap: tuple[float, float]


SIZES = [
    pytest.param(SoakSize("ci", seconds=6.0, fault_gap=(0.5, 1.5)), id="ci"),
    pytest.param(SoakSize("long", seconds=120.0, fault_gap=(10.0, 10.0)), id="long", marks=LONG_VARIANT),
]


@pytest.mark.parametrize("size", SIZES)
def test_schedules_under_random_kills_and_cut_connections_run_each_occurrence_once(
    fault_scenario: FaultScenario, size: SoakSize
) -> None:
    scenario = fault_scenario
    names = install_schedules(scenario.engine, count=SCHEDULES, period=PERIOD, grace=GRACE)
    command = schedule_worker_command(sqlalchemy_url(scenario.database_url), lease=4.0, job_seconds=0.5, max_workers=1)
    database = DatabaseClock(scenario.database_url)
    terminator = SessionTerminator(scenario.database_url)
    faults: list[tuple[str, str]] = []
    kinds: list[str] = []  # the next faults' kinds: one of each, in a seeded order, then the next pair

    def fired_since(worker: str, since) -> bool:
        return any(run.holder.startswith(worker + ":") and run.started_at >= since
                   for run in ScheduleLedger.read(scenario.engine).runs)  # fmt: skip

    try:
        with WorkerFleet(command, log_dir=scenario.log_dir, restart=True) as fleet:
            fleet.start(WORKERS)
            start = database.now()
            began = time.monotonic()
            while time.monotonic() - began < size.seconds:
                time.sleep(scenario.random.uniform(*size.fault_gap))
                scenario.wait_until(fleet.ready_names, timeout=60, what="a process ready to be hit", every=0.02)
                victim = scenario.random.choice(fleet.ready_names())
                kinds = kinds or scenario.random.sample(["kill", "connections"], 2)
                if kinds.pop() == "kill":
                    fleet.kill(victim)
                    faults.append(("kill", victim))
                else:
                    terminator.terminate(f"fault-schedules:{victim}")
                    terminator.terminate(f"outboxkit-schedules:{victim}:", prefix=True)
                    faults.append(("connections", victim))
            recovered = database.now()
            for worker in WORKERS:  # each one fires again by itself (a killed one once restarted)
                scenario.wait_until(lambda worker=worker: fired_since(worker, recovered), timeout=90,
                                    what=f"{worker} firing after the last fault")  # fmt: skip
            end = database.now() - timedelta(seconds=5)  # what is due later may be in flight at the stop
    finally:
        database.close()
        terminator.close()

    context = scenario.context
    ledger = ScheduleLedger.read(scenario.engine)
    assert ledger.duplicates() == [], f"occurrences run twice: {ledger.duplicates()[:5]} ({context})"
    outcomes = ledger.outcomes()
    assert outcomes["missed"] == 0, f"{outcomes} ({context})"
    lost = {name: ledger.uncovered(name, period=PERIOD, grace=GRACE, start=start, end=end) for name in names}
    assert not any(lost.values()), f"occurrences lost: {lost} ({context})"
    assert ledger.early() == [], f"runs started before their fire time: {ledger.early()[:5]} ({context})"
    assert ledger.overlaps() == [], f"runs overlapping: {ledger.overlaps()[:3]} ({context})"
    kills = sum(kind == "kill" for kind, _ in faults)
    print(f"schedule kill soak ({size.variant}): {kills} kills, {len(faults) - kills} cut connections, "
          f"{len(ledger.runs)} runs, outcomes {dict(outcomes)}")
