"""CapBacklog: the rows a pump keeps over their destination's cap, by destination, oldest first, with their deadline."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

from outboxkit.drain.cap_backlog import CapBacklog, Waiting
from outboxkit.transports.base import Delivery
from tests.support.models import SampleEvent

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
TOKEN = uuid.uuid4()


def waiting(row_id: int, destination: str, *, send_by_in: float = 10.0) -> Waiting:
    row = SampleEvent(id=row_id, target_url=f"http://{destination}/hook", payload={})
    return Waiting(row, Delivery(url=f"http://{destination}/hook"), destination, TOKEN, NOW + timedelta(seconds=send_by_in))


def ids(entries: list[Waiting]) -> list[int]:
    return [entry.row.id for entry in entries]


def test_rows_wait_by_destination_and_are_taken_oldest_first():
    backlog = CapBacklog(limit=5)
    backlog.add([waiting(1, "a"), waiting(2, "b"), waiting(3, "a")])
    assert len(backlog) == 3 and backlog.room == 2 and backlog.destinations() == {"a", "b"}
    assert ids(backlog.take({"a"})) == [1, 3]
    assert len(backlog) == 1 and backlog.room == 4 and backlog.destinations() == {"b"}
    assert ids(backlog.take()) == [2]
    assert not backlog and backlog.take() == []


def test_a_backlog_without_room_keeps_nothing():
    backlog = CapBacklog(limit=0)
    assert backlog.room == 0 and not backlog and backlog.next_expiry is None


def test_rows_whose_lease_runs_short_are_taken_when_due_and_the_next_deadline_follows():
    backlog = CapBacklog(limit=10)
    backlog.add([waiting(1, "a", send_by_in=5), waiting(2, "a", send_by_in=1), waiting(3, "b", send_by_in=3)])
    assert backlog.next_expiry == NOW + timedelta(seconds=1)
    assert backlog.expired(NOW) == []  # nothing due yet: nothing moves
    assert ids(backlog.expired(NOW + timedelta(seconds=3))) == [2, 3]  # send_by reached counts as due
    assert len(backlog) == 1 and backlog.destinations() == {"a"}
    assert backlog.next_expiry == NOW + timedelta(seconds=5)
    assert ids(backlog.take({"a"})) == [1]
    assert backlog.next_expiry is None
