"""Scenario 4, a misbehaving receiver: every row follows the outcome rules, never early.

Each row names how the receiver treats it.  Transient trouble (503s, a 429
with ``Retry-After``, an answer slower than the send timeout, a connection
reset in the middle of the response) is retried until it succeeds; a 400 parks
the row at once; a receiver that always fails, or a port that refuses every
connection, parks the row when its attempts run out.  Arrivals are stamped on
the database clock and compared with the due time the previous outcome wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from tests.faults.arrivals import Arrival
from tests.faults.ledger import CLOCK_GRANULARITY
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.support.receiver import Reply

MAX_ATTEMPTS = 4  # set through the settings, as an operator would
# A longer send deadline than the fault outbox's 0.5 s, also set through the settings: the rows'
# exact attempt counts below must not move when a busy host delays a prompt answer past it.
TIMEOUT = 2.0
RETRY_AFTER_SECONDS = 1  # longer than any backoff step, so it must be honoured
SLOW_ANSWER = TIMEOUT * 2
PARTIAL_RESPONSE = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{"ok"'

# behaviour -> (final status, attempts it ends with)
EXPECTED = {
    "ok": ("done", 1),
    "flaky-503": ("done", 3),
    "retry-after": ("done", 2),
    "slow": ("done", 2),
    "reset": ("done", 2),
    "rejected": ("stuck", 1),
    "always-503": ("stuck", MAX_ATTEMPTS),
    "refused": ("stuck", MAX_ATTEMPTS),
}


def misbehave(arrival: Arrival) -> Reply:
    first = arrival.nth == 1
    match arrival.behaviour:
        case "flaky-503" if arrival.nth <= 2:
            return Reply(status=503, body=b"overloaded")
        case "retry-after" if first:
            return Reply(status=429, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        case "slow" if first:
            return Reply(status=200, delay=SLOW_ANSWER)
        case "reset" if first:
            return Reply(reset=True, partial=PARTIAL_RESPONSE)
        case "rejected":
            return Reply(status=400, body=b"malformed")
        case "always-503":
            return Reply(status=503)
    return Reply(status=200)


def is_fault(reply: Reply | None) -> bool:
    return reply is not None and (reply.status != 200 or reply.reset or reply.delay > TIMEOUT)


@dataclass(frozen=True)
class MisbehaviourSize:
    variant: str
    rows_per_behaviour: int


SIZES = [
    pytest.param(MisbehaviourSize("ci", rows_per_behaviour=10), id="ci"),
    pytest.param(MisbehaviourSize("long", rows_per_behaviour=150), id="long", marks=LONG_VARIANT),
]


@pytest.mark.parametrize("size", SIZES)
def test_misbehaving_receiver_rows_follow_the_outcome_rules(fault_scenario: FaultScenario, size: MisbehaviourSize) -> None:
    scenario = fault_scenario
    log = scenario.listen(misbehave, database_clock=True)
    behaviours = [name for name in EXPECTED if name != "refused"] * size.rows_per_behaviour
    scenario.random.shuffle(behaviours)
    scenario.insert(behaviours)
    scenario.insert(["refused"] * size.rows_per_behaviour, url=scenario.refusing_url())

    with scenario.fleet(settings={"max_attempts": MAX_ATTEMPTS, "timeout": TIMEOUT}) as fleet:
        fleet.start(["outboxkit-fault-drain-1", "outboxkit-fault-drain-2"])
        scenario.wait_settled(timeout=60)

    ledger = scenario.ledger(log)
    ledger.assert_invariants(scenario.context)
    for row in ledger.rows:
        assert (row.status, row.attempts) == EXPECTED[row.behaviour], f"{row} ({scenario.context})"
    stuck = ledger.keys(status="stuck")
    assert stuck == ledger.keys(behaviours={"rejected", "always-503", "refused"}), scenario.context
    for row in ledger.rows:
        if row.behaviour == "rejected":
            assert row.last_status_code == 400 and "not retried" in (row.last_error or "")
        elif row.behaviour in ("always-503", "refused"):
            assert "max attempts" in (row.last_error or ""), row
        if row.behaviour == "refused":
            assert ledger.received[row.key] == 0 and "connection" in (row.last_error or ""), row
        if row.behaviour == "retry-after":
            # The 429 was answered after it arrived, so the honoured due time lies
            # at least Retry-After past that arrival.
            told = next(arrival for arrival in ledger.arrivals if arrival.key == row.key and arrival.nth == 1)
            due = ledger.outcomes(row.id)[1].next_attempt_at
            assert due is not None and due - told.at >= timedelta(seconds=RETRY_AFTER_SECONDS) - CLOCK_GRANULARITY, row
    # Each retried request arrived no earlier than the due time its previous outcome wrote.
    retried = [arrival for arrival in ledger.arrivals if arrival.attempt and arrival.attempt > 1]
    assert retried and not ledger.early_arrivals(), f"granularity {CLOCK_GRANULARITY}; {scenario.context}"
    scenario.publish(
        scenario="receiver-misbehaviour",
        title="4. receiver misbehaviour",
        variant=size.variant,
        faults="503s, 429 + Retry-After, answers past the timeout, resets mid-response, 400s, refused connections",
        fault_count=sum(1 for arrival in ledger.arrivals if is_fault(arrival.reply))
        + sum(row.attempts for row in ledger.rows if row.behaviour == "refused"),
        ledger=ledger,
        retried_requests=len(retried),
    )
