"""A receiver that flips between up and down every half second, drained by two processes sharing one breaker.

Both processes open and close the same destination's breaker again and again,
at the same moments (the receiver flips for both).  Real database, real
receiver on 127.0.0.1, the system clock, short cool-downs and backoffs, all
in proportion to the flap (``Flap``): half a second in the default run, a
whole second in the slow variant.
Checked at the end: every row delivered (nothing lost), each row's
``attempts`` equal to the requests that carried its key (no attempt spent
while the breaker held it), the breaker did open, and its state ends closed
and readable.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time

import pytest
from sqlalchemy import create_engine, func, select

from outboxkit import Drainer, HttpTransport
from outboxkit.breaker import BreakerOptions, destination_of
from outboxkit.destinations.store import DestinationStore
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply

ROWS = 60


@dataclasses.dataclass(frozen=True)
class Flap:
    """The receiver's half-period; the breaker's cool-downs, the backoffs and the poll are in proportion to it."""

    seconds: float

    @property
    def breaker(self) -> BreakerOptions:
        return BreakerOptions(failures=3, cool_down=self.seconds, max_cool_down=2 * self.seconds)

    @property
    def down_first(self) -> float:
        return 3 * self.seconds  # longer than the cool-down: the breaker opens and stays open until the receiver is up


FLAPS = [pytest.param(Flap(0.5), id="half-second"), pytest.param(Flap(1.0), id="second", marks=pytest.mark.slow)]


def drain_until_stopped(url: str, stop, flap: Flap) -> None:
    engine = create_engine(sqlalchemy_url(url), pool_size=4)
    options = dataclasses.replace(
        SampleEvent.__outbox__, breaker=flap.breaker, backoff=(flap.seconds / 2, flap.seconds), max_attempts=100,
        timeout=2.0, concurrency=4, batch_size=8,
    )
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=options)
        drainer.start(poll_seconds=flap.seconds / 2)
        stop.wait(300)
        drainer.close()
    engine.dispose()


def flapping(flap: Flap):
    """Down for the first ``flap.down_first`` seconds after the first request, then up and down every ``flap.seconds``.

    Starting down makes the breaker open whatever the host's speed: on a quick host all rows could otherwise be
    delivered within one 'up' second, and the breaker would have nothing to do.  The clock starts at the first
    request, not when the test starts: on a loaded host spawning the two workers can take longer than the down
    period, and every row then went through in an 'up' second."""
    first_request: list[float] = []
    lock = threading.Lock()

    def respond(request) -> Reply:
        now = time.monotonic()
        with lock:
            if not first_request:
                first_request.append(now)
        elapsed = now - first_request[0]
        if elapsed < flap.down_first:
            return Reply(status=503)
        return Reply(status=200) if int(elapsed / flap.seconds) % 2 == 0 else Reply(status=503)

    return respond


@pytest.mark.parametrize("flap", FLAPS)
def test_two_processes_share_a_flapping_destinations_breaker_and_lose_nothing(database_url, engine, read_events, flap):
    with Receiver() as receiver:
        receiver.respond = flapping(flap)
        with engine.begin() as connection:
            connection.execute(
                SampleEvent.__table__.insert(),
                [{"target_url": f"{receiver.url}/hook", "payload": {"n": n}} for n in range(ROWS)],
            )
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        workers = [context.Process(target=drain_until_stopped, args=(database_url, stop, flap)) for _ in range(2)]
        for worker in workers:
            worker.start()
        seen: set[str] = set()  # the breaker's states, sampled while the rows flow
        store = DestinationStore(SampleEvent)
        try:
            deadline = time.monotonic() + 240
            while True:
                with engine.connect() as connection:
                    done = connection.execute(select(func.count()).where(SampleEvent.status == "done")).scalar_one()
                    seen.update(state.status for state in store.all_states(connection))
                if done == ROWS:
                    break
                assert time.monotonic() < deadline, f"{done} of {ROWS} rows delivered in 240 s"
                time.sleep(0.2)  # polled: the rows' status has no event to wait on
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=60)
        assert [worker.exitcode for worker in workers] == [0, 0]
        counts = receiver.count_by_key()
    rows = read_events()
    assert len(rows) == ROWS and {row.status for row in rows.values()} == {"done"}
    for row in rows.values():
        assert row.attempts == counts[str(row.idempotency_key)], row
    assert seen & {"open", "half_open"}, f"the breaker never opened: {seen}"
    with engine.connect() as connection:
        states = store.states(connection, [destination_of(receiver.url)])
    final = states[destination_of(receiver.url)]  # failures were recorded, so the state exists
    assert final.window_failures >= flap.breaker.failures and final.last_status_code == 503
    assert final.status == "healthy"  # the last answers closed it
