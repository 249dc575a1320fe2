"""Scenario 6, a poison row: its delivery kills the worker every time.

The worker dies (SIGKILL to itself) whenever it starts sending the poison
row and is started again by its supervisor.  Because the attempt is counted
before the send, the row runs out of attempts and is parked ``stuck``, while
rows keep being written and delivered.

The rows claimed in the same batch as the poison row die with it once;
they come due together again when the lease ends, and the claim then takes
each row whose last attempt recorded no outcome in a batch of its own, so
only the poison row itself keeps killing workers and its neighbours are
delivered.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.faults.ledger import Ledger
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.faults.worker import POISON
from tests.support.receiver import Reply

MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class PoisonSize:
    variant: str
    rows: int
    poisons: int
    workers: int = 2
    chunks: int = 10  # rows keep arriving in this many chunks while the poison row is retried


SIZES = [
    pytest.param(PoisonSize("ci", rows=400, poisons=1), id="ci"),
    pytest.param(PoisonSize("long", rows=4_000, poisons=3, workers=3), id="long", marks=LONG_VARIANT),
]


def run_poison_scenario(scenario: FaultScenario, size: PoisonSize) -> tuple[Ledger, list[float]]:
    """Rows with poison among them, then more rows while the poison is retried; returns the ledger and death times."""
    log = scenario.listen(lambda arrival: Reply(status=200))
    first = ["ok"] * (size.rows // 2) + [POISON] * size.poisons
    scenario.random.shuffle(first)
    scenario.insert(first)
    with scenario.fleet(restart=True, settings={"max_attempts": MAX_ATTEMPTS}) as fleet:
        fleet.start([f"outboxkit-fault-drain-{index}" for index in range(1, size.workers + 1)])
        scenario.wait_until(lambda: len(fleet.deaths()) >= 1, timeout=60, what="the poison row killed a worker")
        remaining = size.rows - size.rows // 2
        for index in range(size.chunks):
            scenario.insert(["ok"] * (remaining // size.chunks + (index < remaining % size.chunks)))
        scenario.wait_settled(timeout=90)
    ledger = scenario.ledger(log)
    ledger.assert_invariants(scenario.context)
    deaths = fleet.deaths()
    assert all(exit.returncode == -9 for exit in deaths), f"a worker died otherwise: {deaths}"
    return ledger, [exit.at for exit in deaths]


@pytest.mark.parametrize("size", SIZES)
def test_poison_row_ends_stuck_after_max_attempts_while_rows_keep_flowing(
    fault_scenario: FaultScenario, size: PoisonSize
) -> None:
    scenario = fault_scenario
    ledger, deaths = run_poison_scenario(scenario, size)
    poisons = {row.id for row in ledger.rows if row.behaviour == POISON}
    for row in ledger.rows:
        if row.id in poisons:
            assert row.status == "stuck" and row.attempts == MAX_ATTEMPTS, f"{row} ({scenario.context})"
            assert "max attempts" in (row.last_error or ""), row
            assert ledger.received[row.key] == 0, "the poison row kills its worker before anything is sent"
    # One death per attempt of each poison row, fewer only when poison rows shared a batch.
    assert MAX_ATTEMPTS <= len(deaths) <= MAX_ATTEMPTS * size.poisons, f"{len(deaths)} deaths ({scenario.context})"
    # Every other row was delivered, batch neighbours of the poison row included ...
    stuck_others = {row.id for row in ledger.rows if row.status == "stuck" and row.id not in poisons}
    assert not stuck_others, f"rows parked beside the poison: {sorted(stuck_others)} ({scenario.context})"
    # ... and deliveries went on between the poison row's first and last kill.
    between = [arrival for arrival in ledger.arrivals if deaths[0] < arrival.at.timestamp() < deaths[-1]]
    assert between, f"no delivery while the poison row was retried ({scenario.context})"
    scenario.publish(
        scenario="poison-row",
        title="6. poison row",
        variant=size.variant,
        faults=f"{size.poisons} row(s) whose send kills the worker (SIGKILL), max attempts {MAX_ATTEMPTS}",
        fault_count=len(deaths),
        ledger=ledger,
        deliveries_while_poisoned=len(between),
        batch_neighbours_parked=len(stuck_others),
    )


@pytest.mark.slow  # three lease cycles of its own; the CI variant above already checks the neighbours
def test_poison_rows_batch_neighbours_are_delivered(fault_scenario: FaultScenario) -> None:
    ledger, _ = run_poison_scenario(fault_scenario, PoisonSize("ci", rows=20, poisons=1, workers=1, chunks=1))
    others = [row for row in ledger.rows if row.behaviour != POISON]
    assert all(row.status == "done" for row in others), ledger.statuses()
