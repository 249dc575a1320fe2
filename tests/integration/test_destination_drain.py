"""Destinations in a real drain: a failing receiver is contained, healthy ones keep flowing, nothing is lost.

Real database, real receivers on 127.0.0.1: ``Receiver`` (answers as told) and
``Blackhole`` (accepts TCP connections and never answers).  The drainers run
on the manual clock, so cool-downs and backoffs pass when a test says so.
The invariant checked throughout: a row's ``attempts`` equals the number of
requests that carried its key, so a row held back while its destination was
open spent nothing.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, delete, event

from outboxkit import Drainer, HttpTransport
from outboxkit.breaker import BreakerOptions
from outboxkit.destinations.store import DestinationStore
from outboxkit.storage.tables import destinations as destination_table
from tests.support.blackhole import Blackhole
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent, unclaimed_sample_events
from tests.support.receiver import Receiver, Reply

BREAKER = BreakerOptions(failures=3, cool_down=60, max_cool_down=240, probes=1)


@pytest.fixture
def failing_receiver() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def attempts_match_requests(read_events, *receivers: Receiver) -> None:
    sent: dict[str | None, int] = {}
    for receiver in receivers:
        for key, count in receiver.count_by_key().items():
            sent[key] = sent.get(key, 0) + count
    for row in read_events().values():
        assert row.attempts == sent.get(str(row.idempotency_key), 0), row


def state(engine: Engine, url: str):
    from outboxkit.breaker import destination_of

    with engine.connect() as connection:
        return DestinationStore(SampleEvent).states(connection, [destination_of(url)]).get(destination_of(url))


def insert_at(engine: Engine, url: str, payloads: list[dict]) -> list[int]:
    from sqlalchemy import insert

    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": url + "/hook", "payload": payload} for payload in payloads]))


# -- the breaker in a drain --------------------------------------------------------------


def test_an_open_destination_gets_one_probe_per_cool_down_and_its_rows_keep_their_attempts(
    engine, make_drainer, clock, failing_receiver, read_events
):
    failing_receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(6)])
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    assert drainer.drain().retried == 6  # all six were out before the breaker opened
    assert state(engine, failing_receiver.url).status == "open"
    clock.advance(seconds=30)  # past every row's backoff, inside the cool-down
    assert drainer.drain().claimed == 0  # not claimed: the claim leaves an open destination's rows out
    assert len(failing_receiver.requests) == 6
    clock.advance(seconds=31)  # the cool-down is over: one probe, which fails
    drainer.drain()
    assert len(failing_receiver.requests) == 7
    reopened = state(engine, failing_receiver.url)
    assert reopened.status == "open" and reopened.cool_down == 120 and reopened.next_probe_at is not None
    clock.set(reopened.next_probe_at - timedelta(seconds=1))  # a re-opening probes up to a quarter sooner
    drainer.drain()
    assert len(failing_receiver.requests) == 7
    failing_receiver.respond = lambda request: Reply(status=200)
    clock.advance(seconds=2)  # the next probe succeeds: the breaker closes and the waiting rows flow at once
    result = drainer.drain()
    assert result.delivered == 6 and state(engine, failing_receiver.url).status == "healthy"
    assert {row.status for row in read_events().values()} == {"done"}
    attempts_match_requests(read_events, failing_receiver)


def test_two_drainers_send_at_most_the_probes_between_them(engine, make_drainer, clock, failing_receiver, read_events):
    failing_receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3)])
    breaker = dataclasses.replace(BREAKER, probes=3)
    first = make_drainer(breaker=breaker, destination_concurrency=8, max_attempts=20)
    second = make_drainer(breaker=breaker, destination_concurrency=8, max_attempts=20)
    first.drain()
    assert state(engine, failing_receiver.url).status == "open"
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3, 40)])
    clock.advance(seconds=61)
    threads = [threading.Thread(target=drainer.drain) for drainer in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(failing_receiver.requests) == 3 + 3  # the three that opened it, then three probes between both drainers
    assert state(engine, failing_receiver.url).status == "open"  # a failed probe re-opened it
    attempts_match_requests(read_events, failing_receiver)


def test_gone_disables_the_destination_until_a_person_resumes_it(engine, make_drainer, clock, failing_receiver, read_events):
    failing_receiver.respond = lambda request: Reply(status=410)
    insert_at(engine, failing_receiver.url, [{"n": 0}])
    drainer = make_drainer(breaker=BREAKER)
    assert drainer.drain().stuck == 1  # a 4xx: the row itself is stuck, as always
    disabled = state(engine, failing_receiver.url)
    assert disabled.status == "disabled" and disabled.last_status_code == 410
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(1, 5)])
    clock.advance(days=2)
    drainer.drain()
    assert len(failing_receiver.requests) == 1  # nothing else was sent, not even a probe
    failing_receiver.respond = lambda request: Reply(status=200)
    with engine.begin() as connection:
        DestinationStore(SampleEvent).resume(connection, disabled.destination, now=clock.now(), actor="alice")
    assert drainer.drain().delivered == 4
    attempts_match_requests(read_events, failing_receiver)


def test_retry_after_on_429_slows_the_whole_destination(engine, make_drainer, clock, failing_receiver, read_events):
    failing_receiver.respond = lambda request: Reply(status=429, headers={"Retry-After": "120"})
    insert_at(engine, failing_receiver.url, [{"n": 0}])
    drainer = make_drainer(breaker=BREAKER)
    drainer.drain()
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(1, 4)])
    failing_receiver.respond = lambda request: Reply(status=200)
    drainer.drain()
    assert len(failing_receiver.requests) == 1  # the new rows wait with the first one
    clock.advance(seconds=121)
    assert drainer.drain().delivered == 4
    attempts_match_requests(read_events, failing_receiver)


def test_a_probe_row_whose_build_fails_is_not_the_probe(engine, make_drainer, clock, failing_receiver, read_events):
    failing_receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3)])
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    drainer.drain()
    with engine.begin() as connection:
        connection.execute(delete(SampleEvent))
    broken, fine = insert_at(engine, failing_receiver.url, [{"raise": True}, {"n": 9}])
    failing_receiver.respond = lambda request: Reply(status=200)
    clock.advance(seconds=61)
    drainer.drain()
    rows = read_events()
    assert rows[broken].attempts == 1 and rows[broken].last_error.startswith("build_delivery raised")
    assert rows[fine].status == "done"
    assert state(engine, failing_receiver.url).status == "healthy"  # the row that was built probed, and closed it


def test_a_destination_state_deleted_by_hand_loses_no_row(engine, make_drainer, clock, failing_receiver, read_events):
    failing_receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3)])
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    drainer.drain()
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3, 6)])
    clock.advance(seconds=10)
    drainer.drain()  # the new rows are held until the probe
    with engine.begin() as connection:
        connection.execute(delete(destination_table))
    failing_receiver.respond = lambda request: Reply(status=200)
    clock.advance(seconds=51)
    assert drainer.drain().delivered == 6
    attempts_match_requests(read_events, failing_receiver)


def test_a_flapping_receiver_loses_nothing(engine, make_drainer, clock, failing_receiver, read_events):
    answers = iter([503, 200] * 100)
    lock = threading.Lock()

    def flap(request):
        with lock:
            return Reply(status=next(answers))

    failing_receiver.respond = flap
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(20)])
    drainer = make_drainer(breaker=BREAKER, max_attempts=20)
    for _ in range(30):
        drainer.drain()
        if all(row.status == "done" for row in read_events().values()):
            break
        clock.advance(seconds=120)
    assert {row.status for row in read_events().values()} == {"done"}
    attempts_match_requests(read_events, failing_receiver)


def test_destinations_named_by_the_outbox_have_their_own_breakers(
    engine, make_drainer, clock, failing_receiver, read_events, monkeypatch
):
    monkeypatch.setattr(SampleEvent, "destination_for", lambda self, delivery: f"tenant-{self.payload['tenant']}")
    failing_receiver.respond = lambda request: Reply(status=503 if request.body["tenant"] == "a" else 200)
    insert_at(engine, failing_receiver.url, [{"tenant": "a", "n": n} for n in range(3)])
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    drainer.drain()
    insert_at(engine, failing_receiver.url, [{"tenant": tenant, "n": n} for n in range(3) for tenant in "ab"])
    clock.advance(seconds=10)
    result = drainer.drain()
    assert result.delivered == 3  # tenant b flows at the same URL while tenant a's breaker is open
    with engine.connect() as connection:
        states = {item.destination: item.status for item in DestinationStore(SampleEvent).all_states(connection)}
    assert states["tenant-a"] == "open"
    assert states.get("tenant-b", "healthy") == "healthy"  # a destination with nothing but successes needs no row
    attempts_match_requests(read_events, failing_receiver)


# -- isolation: a hanging receiver holds at most its cap ------------------------------------


def test_healthy_destinations_keep_flowing_while_another_hangs(engine, receiver, read_events):
    """On the system clock: rows beyond a cap come back a second later, as in production."""
    options = dataclasses.replace(
        SampleEvent.__outbox__, concurrency=8, batch_size=20, timeout=30, destination_concurrency=2, breaker=BREAKER
    )
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=options)
        try:
            with Blackhole() as blackhole:
                insert_at(engine, blackhole.url, [{"n": n} for n in range(10)])  # the dead rows come first
                # More healthy rows than it waits for, so the blackhole is never the only destination due (its cap
                # lifts then) however late this thread wakes.
                insert_at(engine, receiver.url, [{"n": n} for n in range(440)])
                drainer.start(poll_seconds=1)
                receiver.wait_for(lambda r: len(r.requests) >= 40, timeout=25)  # well inside one 30 s deadline
                assert blackhole.most_open <= 2
                drainer.stop(wait=False)
        finally:
            drainer.close()  # the blackhole closed its connections: the hanging sends have ended
    rows = read_events()
    assert sum(row.status == "done" for row in rows.values()) >= 40
    assert all(row.status == "pending" for row in rows.values() if row.target_url.startswith(blackhole.url))


def test_a_hanging_destination_costs_the_others_no_give_back_and_holds_at_most_its_cap(engine, receiver, read_events):
    """What a capped destination costs the drain: its rows beyond the cap are never claimed (the claim counts its live
    claims), so nothing is given back and no attempt taken back; no state is read besides the claim's own; it holds
    at most its cap of connections, and its rows spend an attempt only for a connection."""
    options = dataclasses.replace(
        SampleEvent.__outbox__, concurrency=8, batch_size=10, timeout=30, destination_concurrency=2, breaker=BREAKER
    )
    statements: list[str] = []

    def note(connection, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement)

    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, options=options)
        event.listen(engine, "before_cursor_execute", note)
        try:
            with Blackhole() as blackhole:
                for n in range(60):  # every third row to the blackhole
                    insert_at(engine, blackhole.url if n % 3 == 0 else receiver.url, [{"n": n}])
                # More healthy rows than it waits for, so the blackhole is never the only destination due (its cap
                # lifts then) however late this thread wakes.
                insert_at(engine, receiver.url, [{"n": n} for n in range(60, 460)])
                drainer.start(poll_seconds=1)
                receiver.wait_for(lambda r: len(r.requests) >= 40, timeout=25)  # well inside one 30 s deadline
                while_running = list(statements)
                drainer.stop(wait=False)
                wait_until(lambda: unclaimed_sample_events(engine, blackhole.url) == 18, timeout=30,
                           message="only its cap of rows was ever claimed")
                sent_to_blackhole = blackhole.accepted
        finally:
            event.remove(engine, "before_cursor_execute", note)
            drainer.close()
    state_reads = [statement for statement in while_running if statement.lstrip().startswith("SELECT") and
                   "outboxkit_destinations" in statement and "FOR" not in statement]
    give_backs = [statement for statement in while_running if "attempts=(sample_event_outbox.attempts - " in statement]
    assert not give_backs and not state_reads
    dead = [row for row in read_events().values() if row.target_url.startswith(blackhole.url)]
    assert len(dead) == 20 and all(row.status == "pending" for row in dead)
    assert sent_to_blackhole == 2  # its cap
    assert sum(row.attempts for row in dead) == 2  # one attempt per connection: nothing spent on rows not sent


def test_one_drain_call_delivers_every_healthy_row_while_another_destination_holds_its_cap(
    engine, make_drainer, receiver, read_events
):
    """A claim that a cap cut short is followed by another once an outcome frees a place (here the healthy
    destination's first answers prove it), so a drain call does not stop at the first capped claim."""
    drainer = make_drainer(concurrency=8, batch_size=10, timeout=30.0, destination_concurrency=2, breaker=BREAKER)
    outcome: list[object] = []
    call = threading.Thread(target=lambda: outcome.append(drainer.drain()))
    try:
        with Blackhole() as blackhole:
            insert_at(engine, blackhole.url, [{"n": n} for n in range(4)])
            healthy = insert_at(engine, receiver.url, [{"n": n} for n in range(20)])
            call.start()
            # Well inside one 30 s deadline.  How many sends the blackhole holds is not asserted here: the cap
            # lifts once its rows are the only ones due (the healthy ones all claimed), which under load may come
            # before the last healthy arrival; the test above holds it to its cap.
            receiver.wait_for(lambda r: len(r.requests) >= 20, timeout=25)
        # The blackhole closed its connections: the hanging sends end, and the call returns.
    finally:
        call.join(timeout=60)
    (result,) = outcome
    rows = read_events()
    assert [rows[row_id].status for row_id in healthy] == ["done"] * 20 and result.delivered == 20


def test_a_destination_opening_is_a_warning_and_its_recovery_is_info(
    engine, make_drainer, clock, failing_receiver, caplog
):
    import logging

    failing_receiver.respond = lambda request: Reply(status=503)
    insert_at(engine, failing_receiver.url, [{"n": n} for n in range(3)])
    drainer = make_drainer(breaker=BREAKER, destination_concurrency=8, max_attempts=20)
    with caplog.at_level(logging.INFO, logger="outboxkit.destinations.gate"):
        drainer.drain()
        failing_receiver.respond = lambda request: Reply(status=200)
        clock.advance(seconds=61)  # the cool-down is over: the probe succeeds
        drainer.drain()
    changes = [(record.levelname, record.status) for record in caplog.records if hasattr(record, "previous")]
    assert changes[0] == ("WARNING", "open")
    assert changes[-1] == ("INFO", "healthy")
