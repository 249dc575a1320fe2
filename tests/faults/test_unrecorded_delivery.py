"""Scenario 2, delivered but not recorded: the receiver accepts, the drainer's session dies.

For a few chosen rows the receiver, on their first arrival, ends every
database session of the worker that sent them (``pg_terminate_backend`` of the
backends whose ``application_name`` is that worker's), waits until they are
gone, and only then answers 2xx.  The worker has delivered the row but cannot
record it.  The row must come back when its lease ends, be delivered again
with the same idempotency key, and end ``done``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from tests.faults.arrivals import Arrival
from tests.faults.models import FAULT_OPTIONS
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.support.receiver import Reply


@dataclass(frozen=True)
class UnrecordedSize:
    variant: str
    rows: int
    victims: int
    workers: int = 2


# Longer than the fault outbox's 0.5 s: the receiver answers a victim only after the worker's sessions have
# exited, which a busy host can make slower than 0.5 s.  The lease grows with it (timeout + lease margin).
SEND_TIMEOUT = 3.0

SIZES = [
    pytest.param(UnrecordedSize("ci", rows=300, victims=4), id="ci"),
    pytest.param(UnrecordedSize("long", rows=3_000, victims=30, workers=3), id="long", marks=LONG_VARIANT),
]


@pytest.mark.parametrize("size", SIZES)
def test_delivered_but_unrecorded_row_is_delivered_again_and_ends_done(
    fault_scenario: FaultScenario, size: UnrecordedSize
) -> None:
    scenario = fault_scenario
    terminator = scenario.terminator()
    victims: set[str] = set()
    terminated: dict[str, int] = {}
    lock = threading.Lock()

    def respond(arrival: Arrival) -> Reply:
        if arrival.key in victims and arrival.nth == 1:
            assert arrival.worker, "every drain request names its worker"
            count = terminator.terminate(arrival.worker)
            with lock:
                terminated[arrival.key] = count
        return Reply(status=200)

    log = scenario.listen(respond)
    keys = scenario.insert(["ok"] * size.rows)
    # Keep victims at least three batches apart, so no two share a batch and a worker (which holds at
    # most one batch's worth of rows at a time) rarely holds two victims at once.
    spacing = size.rows // size.victims
    gap = 3 * FAULT_OPTIONS.batch_size
    assert spacing > gap
    offsets = (scenario.random.randrange(spacing - gap) for _ in range(size.victims))
    victims.update(keys[index * spacing + offset] for index, offset in enumerate(offsets))

    with scenario.fleet(settings={"timeout": SEND_TIMEOUT}) as fleet:
        fleet.start([f"outboxkit-fault-drain-{index}" for index in range(1, size.workers + 1)])
        scenario.wait_settled(timeout=60)

    ledger = scenario.ledger(log)
    ledger.assert_invariants(scenario.context)
    assert ledger.statuses() == {"done": size.rows}, f"{ledger.statuses()} ({scenario.context})"
    first_replies = {arrival.key: arrival.reply for arrival in ledger.arrivals if arrival.nth == 1}
    assert set(terminated) == victims, f"victims that never arrived: {victims - set(terminated)} ({scenario.context})"
    # A victim whose worker had no session left to end was sent while an earlier victim's cut had just
    # closed them all and the worker had not reconnected yet (its sends were claimed before that cut):
    # its record then opens a fresh session.  Correct, but nothing was cut, so it proves nothing here.
    cut = {key for key, count in terminated.items() if count >= 1}
    assert cut, f"no victim's worker had a session to end ({scenario.context})"
    redelivered = 0
    for key in victims:
        row = ledger.by_key[key]
        assert first_replies[key] is not None and first_replies[key].status == 200
        assert row.status == "done", f"{key} ended {row.status} ({scenario.context})"
        if key not in cut:
            continue
        first = ledger.outcomes(row.id).get(1)
        if first is not None and first.status == "done":
            # The drainer's next outcome write happened to open a fresh session (the pool had none
            # left to hand out) and recorded the first attempt after all: correct, and no redelivery.
            assert ledger.received[key] == 1, f"{key} was recorded done and still sent again ({scenario.context})"
            continue
        if first is not None:
            # The send ran out of its deadline while the receiver was still ending the worker's sessions, and
            # the worker recorded a retry: the row was sent again and ended done.  Correct, but nothing was
            # cut; the scenario's long send deadline (SEND_TIMEOUT) makes this rare.
            assert ledger.received[key] >= 2 and row.attempts >= 2, f"{key}: {first} ({scenario.context})"
            continue
        assert ledger.received[key] >= 2, f"{key} was not delivered again ({scenario.context})"
        assert row.attempts >= 2
        redelivered += 1
    # The scenario's point: a delivery whose record was cut is delivered again.  A cut victim can only
    # dodge that by the race above, so most of them, and at least one, must take the redelivery path.
    assert redelivered >= max(1, len(cut) // 2), f"{redelivered} of {len(cut)} cut victims redelivered ({scenario.context})"
    scenario.publish(
        scenario="unrecorded-delivery",
        title="2. delivered, not recorded",
        variant=size.variant,
        faults=f"{size.victims} x pg_terminate_backend of the drainer's sessions after a delivery, before its record",
        fault_count=len(cut),
        ledger=ledger,
        sessions_terminated=sum(terminated.values()),
        interrupted_claims=ledger.interrupted_claims(),
    )
