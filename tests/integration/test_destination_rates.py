"""Rate limits per destination in a real drain: across two processes, rows over the limit keep their attempts.

Real database, real receivers on 127.0.0.1.  The in-process tests run on the
manual clock, so the bucket refills when a test says so; the two-process test
runs on the system clock and counts the requests the receiver got in every
one-second window against the precision docs/destinations.md states.
"""

from __future__ import annotations

import bisect
import dataclasses
import multiprocessing
import os
import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, func, select, text

from outboxkit import Delivery, Drainer, HttpTransport
from outboxkit.breaker import BreakerOptions, destination_of
from outboxkit.policy import AttemptResult
from outboxkit.rate_limits import RateLimit
from outboxkit.storage.ordering import KeyCursor
from tests.integration.test_destination_drain import attempts_match_requests, insert_at
from tests.integration.test_destination_store import (
    DEAD,
    LIVE,
    NOW,
    claim,
    claim_ordered,
    earliest_due,
    insert_ordered,
    insert_rows,
    race,
    rows_by_id,
)
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply

# -- the claim takes the tokens: rows over the rate are never claimed -------------------------------

TWO_A_SECOND = RateLimit(per_second=2)  # a burst of two, then one every half second


def bucket_of(engine, destination: str):
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT tokens, refilled_at FROM outboxkit_destination_rates WHERE outbox = 'sample-events' "
                 "AND destination = :destination"), {"destination": destination}
        ).one_or_none()


def test_rows_over_the_rate_are_never_claimed_and_keep_their_attempts_and_due_times(engine):
    ids = insert_rows(engine, 6)
    cursor = KeyCursor()
    assert claim(engine, at=NOW, cursor=cursor, rate_limit=TWO_A_SECOND) == ids[:2]
    for _ in range(2):  # again at once: no token (nor through the one-destination shortcut)
        assert claim(engine, at=NOW, cursor=cursor, rate_limit=TWO_A_SECOND) == []
    rows = rows_by_id(engine)
    assert {(rows[row_id].attempts, rows[row_id].claim_token, rows[row_id].next_attempt_at) for row_id in ids[2:]} == {
        (0, None, NOW - timedelta(minutes=1))
    }
    assert earliest_due(engine, at=NOW, rate_limit=TWO_A_SECOND) == NOW + timedelta(seconds=0.5)  # its next token
    assert claim(engine, at=NOW + timedelta(seconds=0.5), rate_limit=TWO_A_SECOND) == ids[2:3]
    assert claim(engine, at=NOW + timedelta(seconds=60), rate_limit=TWO_A_SECOND) == ids[3:5]  # the burst, not 120
    assert claim(engine, at=NOW + timedelta(seconds=30), rate_limit=TWO_A_SECOND) == []  # a clock behind adds nothing
    assert bucket_of(engine, DEAD).refilled_at == NOW + timedelta(seconds=60)


def test_only_a_limited_destination_is_held_and_only_it_has_a_bucket(engine):
    limited = insert_rows(engine, 5)
    free = insert_rows(engine, 5, at=LIVE)
    assert sorted(claim(engine, at=NOW, rate_limit=RateLimit(destinations={DEAD: 1}))) == [limited[0], *free]
    assert bucket_of(engine, DEAD) is not None and bucket_of(engine, LIVE) is None


def test_an_ordered_outboxs_heads_take_tokens_too(engine):
    insert_ordered(engine, [f"key-{n}" for n in range(5)], at=DEAD)
    assert len(claim_ordered(engine, at=NOW, rate_limit=TWO_A_SECOND)) == 2
    assert claim_ordered(engine, at=NOW + timedelta(seconds=0.1), rate_limit=TWO_A_SECOND) == []


def _claim_at_the_rate(url: str, barrier, results, tries: int, worker: int) -> None:
    engine = create_engine(sqlalchemy_url(url))
    claimed: list[int] = []
    barrier.wait(timeout=60)
    for attempt in range(tries):
        claimed += claim(engine, at=NOW + timedelta(milliseconds=10 * attempt), rate_limit=RateLimit(per_second=10))
    engine.dispose()
    results.put(claimed)


def test_two_processes_claiming_at_once_together_stay_within_the_rate(engine, database_url):
    insert_rows(engine, 200)
    claimed = race(_claim_at_the_rate, database_url, 25)
    together = len(claimed[0]) + len(claimed[1])
    assert len(set(claimed[0]) | set(claimed[1])) == together  # no row twice
    assert 10 <= together <= 10 + 10 * 0.25  # the burst, and the refill over the quarter second the claims span


# -- in a real drain ------------------------------------------------------------------------------


def test_rows_over_the_limit_wait_for_their_token_and_keep_their_attempts(engine, make_drainer, clock, receiver, read_events):
    ids = insert_at(engine, receiver.url, [{"n": n} for n in range(6)])
    drainer = make_drainer(rate_limit=TWO_A_SECOND)
    result = drainer.drain()
    assert (result.delivered, result.claimed) == (2, 2)
    rows = read_events()
    assert [(rows[row_id].status, rows[row_id].attempts) for row_id in ids[2:]] == [("pending", 0)] * 4
    clock.advance(seconds=0.5)
    assert drainer.drain().delivered == 1  # one token, one row
    clock.advance(seconds=60)  # the bucket is full again: two tokens, not sixty
    assert drainer.drain().delivered == 2
    clock.advance(seconds=60)
    assert drainer.drain().delivered == 1
    assert {row.status for row in read_events().values()} == {"done"}
    attempts_match_requests(read_events, receiver)
    assert bucket_of(engine, destination_of(receiver.url)) is not None


def test_only_the_named_destination_is_limited(engine, make_drainer, clock, read_events):
    with Receiver() as limited, Receiver() as free:
        insert_at(engine, limited.url, [{"n": n} for n in range(5)])
        insert_at(engine, free.url, [{"n": n} for n in range(20)])
        drainer = make_drainer(rate_limit=RateLimit(destinations={destination_of(limited.url): 1}))
        assert drainer.drain().delivered == 21
        assert (len(limited.requests), len(free.requests)) == (1, 20)
        assert bucket_of(engine, destination_of(free.url)) is None  # a destination without a limit has no bucket
        attempts_match_requests(read_events, limited, free)


def test_an_open_destinations_rows_wait_and_its_probe_goes_without_a_token(
    engine, make_drainer, clock, receiver, read_events
):
    receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, receiver.url, [{"n": 0}])
    drainer = make_drainer(
        breaker=BreakerOptions(failures=1, cool_down=60, probes=1), rate_limit=RateLimit(per_second=1), max_attempts=20
    )
    drainer.drain()  # the first row takes the one token, fails, and opens the breaker
    insert_at(engine, receiver.url, [{"n": n} for n in range(1, 4)])
    clock.advance(seconds=0.5)  # the breaker keeps the new rows from the claim; the bucket has half a token
    assert drainer.drain().claimed == 0
    receiver.respond = lambda request: Reply(status=200)
    clock.advance(seconds=60)  # the probe goes (no token) and closes the breaker; the bucket's one token sends one more
    drainer.drain()
    assert len(receiver.requests) == 3  # the third new row waits for its token
    rows = read_events()
    assert sorted(row.status for row in rows.values()) == ["done", "done", "pending", "pending"]  # and the first, in backoff
    attempts_match_requests(read_events, receiver)


# -- two processes share one limit ----------------------------------------------------------

PER_SECOND = 20.0
LIMIT = RateLimit(per_second=PER_SECOND, burst_seconds=0.25)  # a burst of 5


class WorkerTransport:
    """HTTP delivery that names the sending process in a header, so the test sees both processes took part."""

    def __init__(self) -> None:
        self._http = HttpTransport()

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        named = dataclasses.replace(delivery, headers={**delivery.headers, "X-Worker": str(os.getpid())})
        return self._http.send(named, idempotency_key=idempotency_key, timeout=timeout)

    def close(self) -> None:
        self._http.close()


def drain_until_stopped(url: str, stop) -> None:
    engine = create_engine(sqlalchemy_url(url), pool_size=4)
    transport = WorkerTransport()
    options = dataclasses.replace(SampleEvent.__outbox__, rate_limit=LIMIT, batch_size=20, concurrency=8)
    drainer = Drainer(engine, SampleEvent, transport=transport, options=options)
    drainer.start(poll_seconds=0.5)
    stop.wait(300)
    drainer.close()
    transport.close()
    engine.dispose()


def most_in_any_window(moments: list[float], seconds: float) -> int:
    moments = sorted(moments)
    return max(bisect.bisect_left(moments, start + seconds) - index for index, start in enumerate(moments))


@pytest.mark.parametrize("rows", [pytest.param(100, id="5s"), pytest.param(200, id="10s", marks=pytest.mark.slow)])
def test_two_processes_together_stay_within_the_limit_in_every_second(database_url, engine, receiver, read_events, rows):
    """``rows`` at the limit's 20 a second: about 5 s of sends (10 s in the slow variant), every 1 s window checked."""
    insert_at(engine, receiver.url, [{"n": n} for n in range(rows)])
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    workers = [context.Process(target=drain_until_stopped, args=(database_url, stop)) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 180
        while True:
            with engine.connect() as connection:
                done = connection.execute(select(func.count()).where(SampleEvent.status == "done")).scalar_one()
            if done == rows:
                break
            assert time.monotonic() < deadline, f"{done} of {rows} rows delivered in 180 s"
            time.sleep(0.2)  # polled: the rows' status has no event to wait on
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert len({request.headers["X-Worker"] for request in receiver.requests}) == 2  # both processes sent
    assert set(receiver.count_by_key().values()) == {1}  # each row once
    attempts_match_requests(read_events, receiver)
    # docs/destinations.md: at most burst + per_second * T claimed in any window of T seconds; a send follows its
    # claim at once, within half a second here (a loaded host).
    bound = LIMIT.burst_of(PER_SECOND) + PER_SECOND * (1 + 0.5)
    assert most_in_any_window([request.received_at for request in receiver.requests], 1.0) <= bound
