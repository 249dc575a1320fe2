"""Destination state in the real database: transitions, holds that keep attempts, and races between processes.

Each test runs against its own PostgreSQL database holding ``outboxkit_destinations``
and the ``SampleEvent`` outbox.  The races run in separate processes (spawned, each
with its own engine), started together at a barrier.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, create_engine, delete, insert, select, text
from sqlalchemy.orm import Session

from outboxkit.breaker import DISABLED_HOLD, BreakerOptions, Reading, Signal
from outboxkit.destinations.store import DestinationStore
from outboxkit.storage.drain_queries import queries_for
from outboxkit.storage.tables import destinations as destination_table
from tests.support.database import sqlalchemy_url
from tests.support.models import SampleEvent

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
DEAD = "http://127.0.0.1:9"
OPTIONS = BreakerOptions(failures=3, cool_down=10, max_cool_down=40)
FAILED = Reading(Signal.FAILURE)
SUCCEEDED = Reading(Signal.SUCCESS)


@pytest.fixture
def store() -> DestinationStore:
    return DestinationStore(SampleEvent)


def record(engine: Engine, store: DestinationStore, reading: Reading, *, at: datetime = NOW, row_id: int = 1, code=None):
    with engine.begin() as connection:
        return store.record(
            connection, DEAD, reading, now=at, row_id=row_id, error=f"attempt of row {row_id}", status_code=code, options=OPTIONS
        )


def open_breaker(engine: Engine, store: DestinationStore, *, at: datetime = NOW) -> None:
    for row_id in range(1, OPTIONS.failures + 1):
        record(engine, store, FAILED, at=at, row_id=row_id)


def state_of(engine: Engine, store: DestinationStore):
    with engine.connect() as connection:
        return store.states(connection, [DEAD]).get(DEAD)


def insert_rows(engine: Engine, count: int) -> list[int]:
    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    with engine.begin() as connection:
        return list(connection.scalars(statement, [{"target_url": DEAD + "/hook", "payload": {"n": n}} for n in range(count)]))


def claim(engine: Engine, *, at: datetime) -> tuple[list[int], uuid.UUID]:
    """Claim every due row with the drain's own claim statement."""
    token = uuid.uuid4()
    with engine.begin() as connection:
        rows, _, _ = queries_for(SampleEvent).claim_due_rows(
            connection, now=at, lease_until=at + timedelta(seconds=60), limit=100, token=token
        )
    return [row.id for row in rows], token


def claim_quiet(engine: Engine, *, at: datetime) -> bool:
    """The claim's own answer to whether every stored destination state of the outbox is quiet."""
    insert_rows(engine, 1)
    with engine.begin() as connection:
        rows, _, quiet = queries_for(SampleEvent).claim_due_rows(
            connection, now=at, lease_until=at + timedelta(seconds=60), limit=100, token=uuid.uuid4()
        )
    assert rows
    return quiet


def rows_by_id(engine: Engine) -> dict[int, SampleEvent]:
    with Session(engine) as session:
        return {row.id: row for row in session.scalars(select(SampleEvent))}


def hold(engine: Engine, store: DestinationStore, ids: list[int], token: uuid.UUID, *, at: datetime):
    with engine.begin() as connection:
        return store.hold(connection, DEAD, ids=ids, token=token, now=at)


# -- transitions ---------------------------------------------------------------------


def test_the_claim_says_whether_every_destination_state_is_quiet(engine, store):
    """The claim reports, in its own statement, whether the gate has a state to read: none stored, or all healthy
    without a failure run, hold or slow-down, is quiet; a failure run, an open breaker or a Retry-After is not."""
    assert claim_quiet(engine, at=NOW) is True  # no state stored
    record(engine, store, FAILED, row_id=1)
    assert claim_quiet(engine, at=NOW) is False  # a run of one failure
    record(engine, store, SUCCEEDED, row_id=2)
    assert state_of(engine, store).consecutive_failures == 0
    assert claim_quiet(engine, at=NOW) is True  # healthy again
    record(engine, store, Reading(Signal.FAILURE, slow_down=30), row_id=3)
    assert claim_quiet(engine, at=NOW) is False  # slowed by a Retry-After
    with engine.begin() as connection:
        connection.execute(delete(destination_table))
    open_breaker(engine, store)
    assert claim_quiet(engine, at=NOW + timedelta(seconds=1)) is False  # open


def test_the_first_outcome_creates_the_state_and_a_run_of_failures_opens_it(engine, store):
    assert state_of(engine, store) is None
    before, after = record(engine, store, FAILED, row_id=1)
    assert before.status == "healthy" and after.consecutive_failures == 1
    open_breaker(engine, store)
    state = state_of(engine, store)
    assert state.status == "open" and state.consecutive_failures == 4
    assert state.opened_at == NOW and state.next_probe_at == state.held_until == NOW + timedelta(seconds=10)
    assert state.last_error == "attempt of row 3" and state.window_failures == 4


def test_held_rows_keep_their_attempts_and_wait_for_the_probe(engine, store):
    open_breaker(engine, store)
    ids = insert_rows(engine, 3)
    claimed, token = claim(engine, at=NOW)
    assert sorted(claimed) == ids
    assert hold(engine, store, claimed, token, at=NOW) == NOW + timedelta(seconds=10)
    for row in rows_by_id(engine).values():
        assert (row.status, row.attempts, row.claim_token, row.claimed_until) == ("pending", 0, None, None)
        assert row.next_attempt_at == NOW + timedelta(seconds=10)
    assert claim(engine, at=NOW + timedelta(seconds=9))[0] == []


def test_rows_of_a_healthy_or_unknown_destination_are_not_held(engine, store):
    ids = insert_rows(engine, 2)
    claimed, token = claim(engine, at=NOW)
    assert hold(engine, store, claimed, token, at=NOW) is None
    assert {row.attempts for row in rows_by_id(engine).values()} == {1}
    record(engine, store, SUCCEEDED)
    assert hold(engine, store, ids, token, at=NOW) is None


def test_a_successful_probe_closes_the_breaker_and_its_waiting_rows_flow_at_once(engine, store):
    open_breaker(engine, store)
    ids = insert_rows(engine, 4)
    probe_at = NOW + timedelta(seconds=10)
    claimed, token = claim(engine, at=probe_at)
    with engine.begin() as connection:
        assert store.try_probe(connection, DEAD, row_id=claimed[0], now=probe_at, probe_until=probe_at + timedelta(seconds=30))
    waiting_until = hold(engine, store, claimed[1:], token, at=probe_at)
    assert waiting_until == probe_at + timedelta(seconds=30)
    answered = probe_at + timedelta(seconds=1)
    _, after = record(engine, store, SUCCEEDED, at=answered, row_id=claimed[0])
    assert after.status == "healthy"
    rows = rows_by_id(engine)
    assert {rows[row_id].next_attempt_at for row_id in claimed[1:]} == {answered}  # due now, not in 30 s
    assert sorted(claim(engine, at=answered)[0]) == sorted(claimed[1:])
    assert len(ids) == 4


def test_a_failed_probe_moves_the_waiting_rows_to_the_next_longer_cool_down(engine, store):
    open_breaker(engine, store)
    insert_rows(engine, 3)
    probe_at = NOW + timedelta(seconds=10)
    claimed, token = claim(engine, at=probe_at)
    with engine.begin() as connection:
        assert store.try_probe(connection, DEAD, row_id=claimed[0], now=probe_at, probe_until=probe_at + timedelta(seconds=30))
    hold(engine, store, claimed[1:], token, at=probe_at)
    failed_at = probe_at + timedelta(seconds=2)
    _, after = record(engine, store, FAILED, at=failed_at, row_id=claimed[0])
    assert after.status == "open" and after.cool_down == 20 and after.next_probe_at == failed_at + timedelta(seconds=20)
    rows = rows_by_id(engine)
    assert {rows[row_id].next_attempt_at for row_id in claimed[1:]} == {failed_at + timedelta(seconds=20)}
    assert {rows[row_id].attempts for row_id in claimed[1:]} == {0}


def test_a_probe_whose_outcome_never_comes_lets_another_go_when_its_lease_ends(engine, store):
    open_breaker(engine, store)
    probe_at = NOW + timedelta(seconds=10)
    with engine.begin() as connection:
        assert store.try_probe(connection, DEAD, row_id=1, now=probe_at, probe_until=probe_at + timedelta(seconds=30))
        assert not store.try_probe(connection, DEAD, row_id=2, now=probe_at + timedelta(seconds=29), probe_until=NOW)
        assert store.try_probe(
            connection, DEAD, row_id=3, now=probe_at + timedelta(seconds=30), probe_until=probe_at + timedelta(seconds=60)
        )
    assert state_of(engine, store).probe_row_id == 3


def test_gone_disables_and_only_a_resume_releases_the_rows(engine, store):
    record(engine, store, Reading(Signal.GONE), code=410)
    state = state_of(engine, store)
    assert state.status == "disabled" and state.last_status_code == 410
    insert_rows(engine, 2)
    claimed, token = claim(engine, at=NOW)
    assert hold(engine, store, claimed, token, at=NOW) == NOW + DISABLED_HOLD
    with engine.begin() as connection:
        assert not store.try_probe(connection, DEAD, row_id=claimed[0], now=NOW + timedelta(days=30), probe_until=NOW)
    resumed_at = NOW + timedelta(hours=2)
    with engine.begin() as connection:
        after = store.resume(connection, DEAD, now=resumed_at, actor="alice")
    assert after is not None and after.status == "healthy" and after.changed_by == "resumed by alice"
    assert sorted(claim(engine, at=resumed_at)[0]) == sorted(claimed)
    with engine.begin() as connection:
        assert store.resume(connection, "http://never-seen:80", now=resumed_at, actor="alice") is None


def test_a_person_disables_and_probes_now(engine, store):
    with engine.begin() as connection:
        assert store.disable(connection, DEAD, now=NOW, actor="bob").status == "disabled"
        assert store.probe_now(connection, DEAD, now=NOW) is None  # only an open breaker has a cool-down to end
        store.resume(connection, DEAD, now=NOW, actor="bob")
    open_breaker(engine, store)
    insert_rows(engine, 2)
    claimed, token = claim(engine, at=NOW)
    hold(engine, store, claimed, token, at=NOW)
    later = NOW + timedelta(seconds=1)
    with engine.begin() as connection:
        state = store.probe_now(connection, DEAD, now=later)
    assert state is not None and state.probe_due(later)
    assert sorted(claim(engine, at=later)[0]) == sorted(claimed)


def test_a_state_row_deleted_by_hand_loses_no_row(engine, store):
    open_breaker(engine, store)
    insert_rows(engine, 2)
    claimed, token = claim(engine, at=NOW)
    hold(engine, store, claimed, token, at=NOW)
    with engine.begin() as connection:
        connection.execute(delete(destination_table))
    assert state_of(engine, store) is None
    due = NOW + timedelta(seconds=10)
    again, token = claim(engine, at=due)  # the hold's end comes, and the rows are claimed as for a healthy destination
    assert sorted(again) == sorted(claimed)
    assert hold(engine, store, again, token, at=due) is None
    assert {row.attempts for row in rows_by_id(engine).values()} == {1}


def test_a_hold_in_progress_makes_a_closing_transition_wait_so_no_row_waits_for_nothing(engine, store):
    """A hold reads the state FOR SHARE: the success that closes the breaker waits for it, then moves its rows."""
    open_breaker(engine, store)
    insert_rows(engine, 2)
    claimed, token = claim(engine, at=NOW)
    closed = threading.Event()
    with engine.connect() as holding:
        holding.begin()
        assert store.hold(holding, DEAD, ids=claimed, token=token, now=NOW) == NOW + timedelta(seconds=10)

        def close() -> None:
            record(engine, store, SUCCEEDED, at=NOW + timedelta(seconds=1), row_id=99)
            closed.set()

        closer = threading.Thread(target=close)
        closer.start()
        wait_until_blocked(engine)
        assert not closed.is_set()
        holding.commit()
    closer.join(timeout=60)
    assert closed.is_set()
    assert {row.next_attempt_at for row in rows_by_id(engine).values()} == {NOW + timedelta(seconds=1)}


def wait_until_blocked(engine: Engine, timeout: float = 60.0) -> None:
    """Until some session of this database waits on a lock (polled: there is no event to wait on)."""
    deadline = time.monotonic() + timeout
    query = text(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')"
    )
    with engine.connect() as connection:
        while not connection.execute(query).scalar_one():
            assert time.monotonic() < deadline, "no session blocked on the lock in time"
            threading.Event().wait(0.02)
            connection.rollback()


# -- races between processes -------------------------------------------------------------


def _record_failures(url: str, barrier, results, failures: int, worker: int) -> None:
    engine = create_engine(sqlalchemy_url(url))
    store = DestinationStore(SampleEvent)
    opened = 0
    barrier.wait(timeout=60)
    for attempt in range(failures):
        with engine.begin() as connection:
            before, after = store.record(
                connection, DEAD, FAILED, now=NOW, row_id=worker * 1000 + attempt, error="down", status_code=None, options=OPTIONS
            )
        opened += before.status == "healthy" and after.status == "open"
    engine.dispose()
    results.put(opened)


def _try_probes(url: str, barrier, results, tries: int, worker: int) -> None:
    engine = create_engine(sqlalchemy_url(url))
    store = DestinationStore(SampleEvent)
    won = 0
    probe_at = NOW + timedelta(seconds=10)
    barrier.wait(timeout=60)
    for attempt in range(tries):
        with engine.begin() as connection:
            won += store.try_probe(
                connection, DEAD, row_id=worker * 1000 + attempt, now=probe_at, probe_until=probe_at + timedelta(seconds=30)
            )
    engine.dispose()
    results.put(won)


def race(target, database_url: str, count: int) -> list[int]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [context.Process(target=target, args=(database_url, barrier, results, count, worker)) for worker in (1, 2)]
    for process in processes:
        process.start()
    answers = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return answers


def test_two_processes_recording_failures_at_once_count_every_one_and_open_the_breaker_once(engine, store, database_url):
    opened = race(_record_failures, database_url, 20)
    assert sum(opened) == 1
    state = state_of(engine, store)
    assert state.status == "open" and state.consecutive_failures == 40 and state.window_failures == 40


def test_two_processes_racing_for_the_probe_send_exactly_one(engine, store, database_url):
    open_breaker(engine, store)
    won = race(_try_probes, database_url, 25)
    assert sum(won) == 1
    assert state_of(engine, store).status == "half_open"
