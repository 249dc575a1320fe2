"""Schedules: one process's clock steps an hour forward, then back; nothing doubles, nothing is lost.

Three ``schedule_worker`` processes fire schedules of one second (grace 60 s):
five quick ones (each run 0.05 s) and two slow ones (each run 3.5 s under a
3 s lease, so a run lives only if its process renews the lease; the
occurrences that fall during a run wait and coalesce).  The slow variant
(``pytest -m slow``) runs the slow ones 5 s under a 4 s lease.  The processes hold
three, two and two runs at most, seven in all: at a fire time each one
awake claims its share of the quick schedules.  The clock of
``schedules-1`` alone is stepped one hour forward (SIGUSR1) and, once it
has run a whole slow run and a few quick ones with that clock, one hour
back (SIGUSR2); the others keep the system clock.  ``schedules-1`` starts
first, so it holds the slow schedules (a process that ends a run claims its
waiting occurrence at once).  Every process decides by the database server's
clock, so the step changes none of its decisions.

The checks (``ScheduleLedger``): no occurrence ran twice; none was recorded
``missed`` or ``abandoned`` (no lease was swept from a live run: the stepped
process kept renewing) and every fire time ran or coalesced into a later run
within the grace; no run started before its fire time (an hour-ahead clock
would fire early); no schedule's runs overlapped; and the stepped process
went on firing its share while stepped.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from tests.faults.fleet import WorkerFleet
from tests.faults.postgres import DatabaseClock
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.faults.schedule_ledger import ScheduleLedger, install_schedules
from tests.faults.schedule_worker import schedule_worker_command
from tests.support.database import sqlalchemy_url

PERIOD, GRACE = 1.0, 60.0
STEPPED = "schedules-1"
OTHERS = ["schedules-2", "schedules-3"]
QUICK_RUNS_PER_PHASE = 3


@dataclass(frozen=True)
class SlowRuns:
    """How long a slow run takes and the lease it must renew to outlive."""

    lease: float
    seconds: float


SLOW_RUNS = [
    pytest.param(SlowRuns(lease=3.0, seconds=3.5), id="3.5s"),
    pytest.param(SlowRuns(lease=4.0, seconds=5.0), id="5s", marks=LONG_VARIANT),
]


@pytest.mark.parametrize("slow_runs", SLOW_RUNS)
def test_a_clock_stepped_an_hour_forward_and_back_on_one_process_doubles_and_loses_nothing(
    fault_scenario: FaultScenario, slow_runs: SlowRuns
) -> None:
    scenario = fault_scenario
    names = install_schedules(scenario.engine, count=2, period=PERIOD, grace=GRACE, prefix="slow")
    names += install_schedules(scenario.engine, count=5, period=PERIOD, grace=GRACE, prefix="tick")
    database = DatabaseClock(scenario.database_url)
    command = schedule_worker_command(
        sqlalchemy_url(scenario.database_url), lease=slow_runs.lease, job_seconds=0.05, slow_seconds=slow_runs.seconds,
        stepped=frozenset({STEPPED}), max_workers={STEPPED: 3, **dict.fromkeys(OTHERS, 2)},
    )  # fmt: skip

    def runs_of(worker: str, since: datetime, *, slow: bool, finished: bool = False) -> int:
        return sum(
            run.holder.startswith(worker + ":") and run.started_at >= since and run.name.startswith("slow-") == slow
            and (run.finished_at is not None or not finished)
            for run in ScheduleLedger.read(scenario.engine).runs
        )  # fmt: skip

    def phase(since: datetime, what: str) -> None:
        """The stepped process runs a whole slow run (its lease renewed) and a few quick ones from ``since``."""
        scenario.wait_until(lambda: runs_of(STEPPED, since, slow=True, finished=True) >= 1, timeout=90,
                            what=f"a slow run of the stepped process {what}")  # fmt: skip
        scenario.wait_until(lambda: runs_of(STEPPED, since, slow=False) >= QUICK_RUNS_PER_PHASE, timeout=60,
                            what=f"quick runs of the stepped process {what}")  # fmt: skip

    def stepped() -> int:
        return len(fleet.events("stepped"))

    try:
        with WorkerFleet(command, log_dir=scenario.log_dir) as fleet:
            start = database.now()
            fleet.start([STEPPED])
            scenario.wait_until(lambda: runs_of(STEPPED, start, slow=True) >= 2, timeout=60, what="the slow runs held")
            fleet.start(OTHERS)
            for worker in OTHERS:
                scenario.wait_until(lambda worker=worker: runs_of(worker, start, slow=False), timeout=60,
                                    what=f"{worker} firing")  # fmt: skip

            fleet.send_signal(STEPPED, signal.SIGUSR1)  # one hour forward
            scenario.wait_until(lambda: stepped() == 1, timeout=60, what="the step forward taken")
            forward = database.now()
            phase(forward, "an hour ahead")

            fleet.send_signal(STEPPED, signal.SIGUSR2)  # and back
            scenario.wait_until(lambda: stepped() == 2, timeout=60, what="the step back taken")
            back = database.now()
            phase(back, "after the step back")
            stopped = database.now()
            end = stopped - timedelta(seconds=10)  # what is due later may wait behind a slow run at the stop
        deaths = fleet.deaths()
        steps = [event["offset_seconds"] for event in fleet.events("stepped")]
    finally:
        database.close()

    context = scenario.context
    ledger = ScheduleLedger.read(scenario.engine)
    assert deaths == [], f"a process died: {deaths} ({context})"
    assert steps == [3600.0, 0.0], steps
    assert ledger.duplicates() == [], f"occurrences run twice: {ledger.duplicates()[:5]} ({context})"
    outcomes = ledger.outcomes()
    assert outcomes["missed"] == 0 and outcomes["abandoned"] == 0, f"{outcomes} ({context})"
    lost = {name: ledger.uncovered(name, period=PERIOD, grace=GRACE, start=start, end=end) for name in names}
    assert not any(lost.values()), f"occurrences lost: {lost} ({context})"
    assert ledger.early() == [], f"runs started before their fire time: {ledger.early()[:5]} ({context})"
    assert ledger.overlaps() == [], f"runs overlapping: {ledger.overlaps()[:3]} ({context})"
    phases = {"before": (start, forward), "an hour ahead": (forward, back), "after": (back, stopped)}
    holders = {phase: sorted(ledger.holders_between(*window)) for phase, window in phases.items()}
    print(f"clock step: {len(ledger.runs)} runs, outcomes {dict(outcomes)}, stepped for "
          f"{(back - forward).total_seconds():.1f} s; processes firing per phase {holders}")  # fmt: skip
