"""Scenario 1, kill -9 soak: drain processes die at random moments; no row is lost.

Three drain workers share one outbox while rows keep arriving and a receiver
answers after a few milliseconds.  At random moments (seeded) a random ready
worker gets SIGKILL and is started again, as a process manager would.  After
the horizon every row is done or stuck, the receiver saw every key at least
once, every request repeats the key of a row, and attempts never went down.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import pytest

from tests.faults.arrivals import Arrival
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.support.receiver import Reply


@dataclass(frozen=True)
class SoakSize:
    variant: str
    rows: int
    kills: int
    workers: int = 3
    kill_gap: tuple[float, float] = (0.3, 1.0)  # seconds between two kills
    # Seconds from a chunk's insert to the kill: the NOTIFY has woken the drains and they are still sending it.
    kill_delay: tuple[float, float] = (0.02, 0.15)
    horizon: float = 90.0  # seconds allowed after the last kill for the leases to run out


SIZES = [
    pytest.param(SoakSize("ci", rows=2_000, kills=8), id="ci"),
    pytest.param(SoakSize("long", rows=20_000, kills=100, horizon=300.0), id="long", marks=LONG_VARIANT),
]


def receiver_latency(arrival: Arrival) -> Reply:
    """2-20 ms, fixed per key, so a replay sees the same receiver."""
    digest = hashlib.blake2b((arrival.key or "").encode(), digest_size=2).digest()
    return Reply(status=200, delay=0.002 + int.from_bytes(digest, "big") % 19 / 1000)


@pytest.mark.parametrize("size", SIZES)
def test_kill_soak_loses_no_row(fault_scenario: FaultScenario, size: SoakSize) -> None:
    scenario = fault_scenario
    log = scenario.listen(receiver_latency)
    names = [f"outboxkit-fault-drain-{index}" for index in range(1, size.workers + 1)]
    chunk = -(-size.rows // size.kills)
    with scenario.fleet(restart=True) as fleet:
        fleet.start(names)
        inserted = 0
        for _ in range(size.kills):
            scenario.wait_until(fleet.ready_names, timeout=60, what="a drain worker ready to be killed", every=0.02)
            time.sleep(scenario.random.uniform(*size.kill_gap))
            # Rows keep arriving while workers die, and each kill follows a chunk's arrival closely enough to land
            # in a busy drain: a chunk drains in well under a second, so a kill a whole gap after its insert would
            # mostly find idle workers (and then the soak tests nothing).
            inserted += len(scenario.insert(["ok"] * min(chunk, size.rows - inserted)))
            victim = scenario.random.choice(fleet.ready_names())
            time.sleep(scenario.random.uniform(*size.kill_delay))  # the random moment is the fault itself
            assert fleet.kill(victim) is not None, f"{victim} was not running ({scenario.context})"
        scenario.wait_settled(timeout=size.horizon)

    ledger = scenario.ledger(log)
    ledger.assert_invariants(scenario.context)
    kills = [exit for exit in fleet.deaths() if exit.returncode == -9]
    assert len(kills) == size.kills, f"expected {size.kills} SIGKILLs, saw {kills} ({scenario.context})"
    missing = ledger.keys() - set(ledger.received)
    assert not missing, f"{len(missing)} keys never reached the receiver ({scenario.context})"
    assert ledger.interrupted_claims() > 0, f"no kill interrupted a claim: the soak tested nothing ({scenario.context})"
    scenario.publish(
        scenario="kill-soak",
        title="1. kill -9 soak",
        variant=size.variant,
        faults=f"{size.kills} x SIGKILL of a random one of {size.workers} drainers, restarted",
        fault_count=size.kills,
        ledger=ledger,
        interrupted_claims=ledger.interrupted_claims(),
        requests=len(ledger.arrivals),
    )
