"""Scenario 7, graceful stop: SIGTERM during a busy drain.

Workers drain a backlog from a slow receiver.  When several sends are in
flight, every worker gets SIGTERM.  Each must let its in-flight deliveries
finish and record them, claim nothing after it handled the signal, and exit
0 within the grace period; the rows it never claimed stay pending, untouched.
"Claim nothing" is checked against the moment each claim's statement began
(the database server's time its lease is computed from), less the time a
statement takes to reach the server: the drain asks whether it may claim
just before it sends the statement, so a claim let through just before the
signal may begin on the server just after it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from tests.faults.ledger import CLOCK_GRANULARITY
from tests.faults.models import FAULT_OPTIONS
from tests.faults.scenario import LONG_VARIANT, FaultScenario
from tests.support.receiver import Reply

# The longest a claimed batch can take is one timeout per round of sends;
# the grace period leaves room for a loaded machine on top.
GRACE_SECONDS = 10 * FAULT_OPTIONS.lease_seconds
# How long after the drain let a claim through its statement may begin on the server (a loaded host's round trip).
STATEMENT_REACH = CLOCK_GRANULARITY + timedelta(milliseconds=250)


@dataclass(frozen=True)
class GracefulSize:
    variant: str
    rows: int
    workers: int
    in_flight_before_signal: int


SIZES = [
    pytest.param(GracefulSize("ci", rows=600, workers=2, in_flight_before_signal=8), id="ci"),
    pytest.param(GracefulSize("long", rows=6_000, workers=3, in_flight_before_signal=24), id="long", marks=LONG_VARIANT),
]


@pytest.mark.parametrize("size", SIZES)
def test_sigterm_finishes_in_flight_sends_and_claims_nothing_more(fault_scenario: FaultScenario, size: GracefulSize) -> None:
    scenario = fault_scenario
    # Slow answers (well inside the send timeout) keep deliveries in flight.
    log = scenario.listen(lambda arrival: Reply(status=200, delay=scenario.random.uniform(0.05, 0.2)))
    scenario.insert(["ok"] * size.rows)
    names = [f"outboxkit-fault-drain-{index}" for index in range(1, size.workers + 1)]
    with scenario.fleet() as fleet:
        fleet.start(names)
        scenario.wait_until(lambda: scenario.count("done") >= 2 * FAULT_OPTIONS.batch_size, timeout=60, what="a busy drain")
        scenario.wait_until(
            lambda: scenario.receiver.in_flight >= size.in_flight_before_signal,
            timeout=60,
            what=f"{size.in_flight_before_signal} deliveries in flight",
            every=0.005,
        )
        signalled_at = datetime.now(timezone.utc)
        for name in names:
            assert fleet.send_signal(name, signal.SIGTERM) is not None, f"{name} was not running"
        returncodes = {name: fleet.wait_exit(name, timeout=GRACE_SECONDS) for name in names}
    assert returncodes == {name: 0 for name in names}, f"not a clean exit within {GRACE_SECONDS:g}s: {returncodes}"

    ledger = scenario.ledger(log)
    # Lost here: a row marked done that never arrived, or one claimed and then abandoned.
    lost = len(ledger.done_never_received()) + len(ledger.live_claims())
    assert lost == 0, f"lost rows: {ledger.done_never_received()[:3]} {ledger.live_claims()[:3]} ({scenario.context})"
    assert not ledger.unknown_keys() and not ledger.attempts_decreases() and not ledger.sends_beyond_attempts()
    # In-flight deliveries finished and were recorded: no claim is left open.  A key that arrived more
    # than once was sent again only after its earlier attempt's outcome was written (an answer that
    # missed the 0.5 s deadline on a busy host is a recorded retry), never while it was in flight.
    assert ledger.interrupted_claims() == 0, f"claims without an outcome ({scenario.context})"
    resent = [row for row in ledger.rows if ledger.received.get(row.key, 0) > 1]
    unrecorded = [row.key for row in resent if len(ledger.outcomes(row.id)) < ledger.received[row.key]]
    assert not unrecorded, f"sent again without a recorded outcome: {unrecorded[:3]} ({scenario.context})"
    # No claim was begun after a worker handled its signal.  A claim's lease is
    # the server's time at its statement plus the lease length; the statement
    # was let through (may_claim) at most STATEMENT_REACH before that.
    handled = {event["name"]: event["at"] for event in fleet.events("stop_requested")}
    assert set(handled) == set(names), f"workers that did not report the signal: {set(names) - set(handled)}"
    lease = timedelta(seconds=FAULT_OPTIONS.lease_seconds)
    late = [
        claim
        for claim in ledger.claims()
        if claim.next_attempt_at is not None
        and (claim.next_attempt_at - lease - STATEMENT_REACH).timestamp() > handled[claim.application_name]
    ]
    assert not late, f"claims after the signal: {late[:3]} ({scenario.context})"
    # Sends in flight at the signal were finished, not dropped.
    finished_after = [
        claim
        for claim in ledger.claims()
        if any(outcome.written_at > signalled_at for outcome in ledger.outcomes(claim.row_id).values())
    ]
    assert finished_after, "no delivery was in flight when the signal came: the scenario tested nothing"
    # The rest were never touched.  (A pending row with attempts was in flight and
    # had its outcome, a retry, recorded: no claim is left open, checked above.)
    statuses = ledger.statuses()
    assert set(statuses) <= {"done", "pending"}, statuses
    leftovers = [row for row in ledger.rows if row.status == "pending" and row.attempts == 0]
    assert leftovers, "no row was left: the signal did not come during a busy drain"
    retried = [row for row in ledger.rows if row.status == "pending" and row.attempts > 0]
    assert all(row.last_error for row in retried), f"pending after an attempt with no outcome: {retried[:3]}"
    scenario.publish(
        scenario="graceful-stop",
        title="7. graceful stop",
        variant=size.variant,
        faults=f"SIGTERM to {size.workers} busy drainers (>= {size.in_flight_before_signal} sends in flight)",
        fault_count=size.workers,
        ledger=ledger,
        lost=lost,
        finished_after_signal=len(finished_after),
        left_pending=len(leftovers),
        retry_recorded=len(retried),
    )
