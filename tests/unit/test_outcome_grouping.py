"""The bounds on grouped outcome commits (outboxkit.drain.pump.gather_group, outboxkit.drain.record.OutcomeGrouping).

``gather_group`` reads the pump's event queue; a queue that records each
blocking read shows whether, and for how long at most, a group waited.
"""

from __future__ import annotations

import queue
import uuid

import pytest

from outboxkit.drain.loop import STOP, WAKE
from outboxkit.drain.pump import gather_group
from outboxkit.drain.record import (
    DEFAULT_GROUP_MAX_DELAY_SECONDS,
    DEFAULT_GROUP_MAX_ROWS,
    MAX_GROUP_DELAY_SECONDS,
    FinishedSend,
    OutcomeGrouping,
)
from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult
from tests.support.models import SampleEvent


class WatchedQueue(queue.SimpleQueue[object]):
    """Records the timeout of every blocking read."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block:
            self.waits.append(timeout)
        return super().get(block, timeout)


def finished(row_id: int) -> FinishedSend:
    return FinishedSend(SampleEvent(id=row_id, attempts=1), uuid.uuid4(), AttemptResult(status_code=200))


def queued(*events: object) -> WatchedQueue:
    events_queue = WatchedQueue()
    for event in events:
        events_queue.put(event)
    return events_queue


def ids(group: list[FinishedSend]) -> list[int]:
    return [item.row.id for item in group]


def test_the_defaults_are_the_documented_bounds():
    grouping = OutcomeGrouping()
    assert (grouping.max_rows, grouping.max_delay) == (DEFAULT_GROUP_MAX_ROWS, DEFAULT_GROUP_MAX_DELAY_SECONDS) == (50, 0.002)


def test_with_nothing_else_in_flight_an_outcome_is_written_at_once():
    events = queued()
    group, control = gather_group(finished(1), events, in_flight=1, grouping=OutcomeGrouping(max_delay=0.1))
    assert ids(group) == [1] and control is None
    assert events.waits == []  # no wait at all


def test_queued_outcomes_join_without_waiting_once_every_row_in_flight_is_in():
    events = queued(finished(2), finished(3))
    group, control = gather_group(finished(1), events, in_flight=3, grouping=OutcomeGrouping(max_delay=0.1))
    assert ids(group) == [1, 2, 3] and control is None
    assert events.waits == []


def test_while_other_sends_are_out_it_waits_at_most_max_delay():
    events = queued(finished(2))
    group, control = gather_group(finished(1), events, in_flight=5, grouping=OutcomeGrouping(max_delay=0.01))
    assert ids(group) == [1, 2] and control is None
    assert events.waits and all(wait is not None and 0 < wait <= 0.01 for wait in events.waits)


def test_a_group_never_exceeds_max_rows():
    events = queued(*(finished(n) for n in range(2, 8)))
    group, _ = gather_group(finished(1), events, in_flight=7, grouping=OutcomeGrouping(max_rows=3, max_delay=0.1))
    assert ids(group) == [1, 2, 3]
    assert events.qsize() == 4  # the rest wait for the next group


def test_a_max_delay_of_zero_takes_only_what_is_queued():
    events = queued(finished(2))
    group, _ = gather_group(finished(1), events, in_flight=5, grouping=OutcomeGrouping(max_delay=0))
    assert ids(group) == [1, 2]
    assert events.waits == []


@pytest.mark.parametrize("control_event", [WAKE, STOP], ids=["wake", "stop"])
def test_a_wake_up_or_a_stop_ends_the_gathering_and_is_handed_back(control_event):
    events = queued(finished(2), control_event, finished(3))
    group, control = gather_group(finished(1), events, in_flight=4, grouping=OutcomeGrouping(max_delay=0.1))
    assert ids(group) == [1, 2] and control is control_event
    assert events.qsize() == 1  # the outcome after it is left for the next group


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_rows": 0},
        {"max_rows": True},
        {"max_rows": 2.5},
        {"max_delay": -0.001},
        {"max_delay": MAX_GROUP_DELAY_SECONDS * 2},
        {"max_delay": float("nan")},
        {"max_delay": "0.002"},
    ],
)
def test_bounds_outside_their_range_are_refused_with_the_range(arguments):
    with pytest.raises(ConfigurationError, match="OutcomeGrouping"):
        OutcomeGrouping(**arguments)
