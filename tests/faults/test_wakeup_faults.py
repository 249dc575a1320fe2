"""Wake-ups under faults: a wake-up left pending by a process that died, or one sent while nobody listened.

An insert notifies only when its outbox has no wake-up pending
(``outboxkit.storage.wakeups``); the drain loop that caught up clears it.
Two faults leave a wake-up pending with nobody to clear it, and every insert
after them relies on it:

* the only worker is frozen when an insert notifies (so it never clears), then
  killed; a new worker starts and rows are inserted;
* the worker's listener session is terminated, and a row is inserted while
  the listener is down (its notification reaches nobody).

The workers' safety-net poll is ten minutes away (``drain_interval``), so a
row delivered within the wait below was delivered by a wake-up (the new
worker's or the reconnected listener's catch-up claim, then the notifications
after its clear), never by the poll.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text

from outboxkit.storage.notify import install_trigger_sql
from tests.faults.fleet import WorkerFleet
from tests.faults.models import FaultEvent
from tests.faults.scenario import FaultScenario
from tests.support.receiver import Reply

SAFETY_NET = 600.0  # seconds: the loops' poll and the elected drain, both far beyond every wait here
WAIT = 60.0  # seconds for a delivery: room for a loaded machine, ten times less than the poll


def install_wakeups(scenario: FaultScenario) -> None:
    with scenario.engine.begin() as connection:
        for statement in install_trigger_sql(FaultEvent):
            connection.execute(text(statement))


def pending_wakeups(scenario: FaultScenario) -> int:
    with scenario.engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM outboxkit_wakeups")).scalar_one())


def listening(fleet: WorkerFleet, name: str) -> list[dict[str, object]]:
    return fleet.events("listening", name=name)


def start_listening(scenario: FaultScenario, fleet: WorkerFleet, name: str) -> None:
    fleet.start([name])
    scenario.wait_until(lambda: bool(listening(fleet, name)), timeout=WAIT, what=f"{name} listening")


def delivered(scenario: FaultScenario, count: int, what: str) -> None:
    scenario.wait_until(lambda: scenario.count("done") >= count, timeout=WAIT, what=what)


def first_row_delivered(scenario: FaultScenario, fleet: WorkerFleet, name: str) -> None:
    """Start ``name``, deliver one row through its wake-up and wait until the caught-up worker cleared it."""
    start_listening(scenario, fleet, name)
    scenario.insert(["ok"])
    delivered(scenario, 1, "the first row, woken by its insert")
    scenario.wait_until(lambda: pending_wakeups(scenario) == 0, timeout=WAIT, what="the caught-up worker clearing")


@contextmanager
def delivering_fleet(scenario: FaultScenario, name: str) -> Iterator[WorkerFleet]:
    """A fleet whose worker ``name`` delivered one row and cleared its wake-up; every row delivered once after."""
    install_wakeups(scenario)
    log = scenario.listen(lambda arrival: Reply(status=200))
    with scenario.scheduler_fleet(tick=0.3, probe=0.3, drain_interval=SAFETY_NET) as fleet:
        first_row_delivered(scenario, fleet, name)
        yield fleet
    ledger = scenario.ledger(log)
    ledger.assert_invariants(scenario.context)
    assert set(ledger.received) == ledger.keys()


def test_a_wake_up_left_pending_by_a_killed_worker_does_not_hold_up_the_next_worker(
    fault_scenario: FaultScenario,
) -> None:
    scenario = fault_scenario
    with delivering_fleet(scenario, "outboxkit-fault-wake-1") as fleet:

        fleet.send_signal("outboxkit-fault-wake-1", signal.SIGSTOP)
        scenario.insert(["ok"])  # notifies: the frozen worker never clears it
        assert pending_wakeups(scenario) == 1
        fleet.kill("outboxkit-fault-wake-1")
        assert pending_wakeups(scenario) == 1  # the fault: a wake-up pending that nobody will clear

        start_listening(scenario, fleet, "outboxkit-fault-wake-2")
        for rows in range(3, 6):  # each insert after the new worker started; the first may rely on the stale wake-up
            scenario.insert(["ok"])
            delivered(scenario, rows, f"row {rows}, inserted while the new worker listens")


def test_a_row_inserted_while_the_listener_is_down_is_delivered_when_it_reconnects(
    fault_scenario: FaultScenario,
) -> None:
    scenario = fault_scenario
    terminator = scenario.terminator()
    name = "outboxkit-fault-wake-1"
    with delivering_fleet(scenario, name) as fleet:

        fleet.send_signal(name, signal.SIGSTOP)  # so the listener cannot reconnect before the insert
        (event,) = listening(fleet, name)
        assert terminator.terminate_pid(int(str(event["backend_pid"])))
        scenario.insert(["ok"])  # its notification reaches nobody; the wake-up stays pending
        assert pending_wakeups(scenario) == 1
        fleet.send_signal(name, signal.SIGCONT)
        scenario.wait_until(lambda: len(listening(fleet, name)) >= 2, timeout=WAIT, what="the listener reconnecting")
        delivered(scenario, 2, "the row inserted while the listener was down")
        for rows in range(3, 5):
            scenario.insert(["ok"])
            delivered(scenario, rows, f"row {rows}, inserted after the listener reconnected")
