"""What a drainer keeps in memory per destination, and for how long (``outboxkit.destinations.gate``).

A destination with no send in flight that the drainer has not used for ``forget_after`` is forgotten; what is
forgotten is what a fresh drainer starts without, so its decisions after that are a fresh drainer's.  Real database,
real receiver on 127.0.0.1; the gate's monotonic clock is a test clock, so idle time passes when a test says so.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, insert

from outboxkit.breaker import BreakerOptions
from outboxkit.destinations.gate import FORGET_AFTER_SECONDS, DestinationGate
from outboxkit.model import OutboxOptions
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply

BREAKER = BreakerOptions(failures=3, cool_down=60, max_cool_down=240, probes=1)


class Ticks:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.value = 1_000.0

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


@pytest.fixture
def by_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SampleEvent, "destination_for", lambda self, delivery: f"tenant-{self.payload['tenant']}")


def insert_for(engine: Engine, url: str, tenants: list[object]) -> None:
    with engine.begin() as connection:
        connection.execute(insert(SampleEvent), [{"target_url": url + "/hook", "payload": {"tenant": t}} for t in tenants])


def requests_of(receiver: Receiver, tenant: object) -> int:
    return sum(1 for request in receiver.requests if request.body["tenant"] == tenant)


def test_destinations_used_once_then_idle_are_forgotten_after_the_bound(engine, make_drainer, receiver, by_tenant):
    drainer = make_drainer(breaker=BREAKER)
    ticks = Ticks()
    drainer.gate.monotonic = ticks
    insert_for(engine, receiver.url, list(range(300)))
    assert drainer.drain().delivered == 300
    assert len(drainer.gate.remembered()) == 300
    ticks.advance(drainer.gate.forget_after - 1)
    insert_for(engine, receiver.url, ["a"])
    assert drainer.drain().delivered == 1
    assert len(drainer.gate.remembered()) == 301  # idle, but not yet for the whole bound
    ticks.advance(1)
    insert_for(engine, receiver.url, ["b"])
    assert drainer.drain().delivered == 1
    assert drainer.gate.remembered() == {"tenant-a", "tenant-b"}


def test_the_bound_is_never_shorter_than_the_lease(engine):
    """Rows waiting over a cap and outcomes still to record live within their claim's lease, so a destination is
    never forgotten while one of its rows is claimed here."""
    assert DestinationGate(engine, SampleEvent, options=SampleEvent.__outbox__).forget_after == FORGET_AFTER_SECONDS
    long = OutboxOptions(job_name="sample-events", lease=FORGET_AFTER_SECONDS * 3)
    assert DestinationGate(engine, SampleEvent, options=long).forget_after == FORGET_AFTER_SECONDS * 3


@pytest.mark.parametrize("drainer_kind", ["forgetful", "fresh"])
def test_an_open_breaker_is_honoured_after_forgetting_as_by_a_fresh_drainer(
    engine, make_drainer, clock, receiver, by_tenant, read_events, drainer_kind
):
    """The forgetting drainer's claim reads the open state: it claims and sends nothing, as a drainer started after
    the breaker opened does; when the cool-down ends, both send exactly one probe."""
    receiver.respond = lambda request: Reply(status=503 if request.body["tenant"] == "down" else 200)
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    ticks = Ticks()
    drainer.gate.monotonic = ticks
    insert_for(engine, receiver.url, ["down"] * 3)
    assert drainer.drain().retried == 3
    assert "tenant-down" in drainer.gate.remembered()
    if drainer_kind == "forgetful":
        ticks.advance(drainer.gate.forget_after)
        insert_for(engine, receiver.url, ["up"])
        assert drainer.drain().delivered == 1
        assert drainer.gate.remembered() == {"tenant-up"}
    else:
        drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    clock.advance(seconds=30)  # past the rows' backoff, inside the cool-down
    insert_for(engine, receiver.url, ["down"])
    result = drainer.drain()
    assert (result.delivered, result.retried) == (0, 0)
    assert requests_of(receiver, "down") == 3  # held, not sent
    assert sorted(row.attempts for row in read_events().values() if row.payload["tenant"] == "down") == [0, 1, 1, 1]
    clock.advance(timedelta(seconds=BREAKER.cool_down))
    drainer.drain()
    assert requests_of(receiver, "down") == 4  # one probe, then held again
