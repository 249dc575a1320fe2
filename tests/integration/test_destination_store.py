"""Destination state across processes, and the claim that reads it (outboxkit.storage.destination_claim).

The claim decides in its one statement which rows may go: a blocked destination's rows are not claimed (their
attempts and due times untouched), exactly one probe per cool-down gets through, and each batch is shared across
destinations.  Outcomes change the shared state under its row lock.
"""

from __future__ import annotations

import multiprocessing
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, create_engine, delete, insert, select, text
from sqlalchemy.orm import Session

from outboxkit.breaker import BreakerOptions, Reading, Signal
from outboxkit.destinations.store import DestinationStore, Observation
from outboxkit.rate_limits import RateLimit
from outboxkit.storage.drain_queries import queries_for, rate_parameters
from outboxkit.storage.ordering import KeyCursor
from outboxkit.storage.tables import destinations as destination_table
from tests.support.database import sqlalchemy_url
from tests.support.models import OrderedEvent, SampleEvent

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
DEAD = "http://127.0.0.1:9"
LIVE = "http://127.0.0.1:8"
OPTIONS = BreakerOptions(failures=3, cool_down=10, max_cool_down=40)
FAILED = Reading(Signal.FAILURE)
SUCCEEDED = Reading(Signal.SUCCESS)


@pytest.fixture
def store() -> DestinationStore:
    return DestinationStore(SampleEvent)


def record(engine: Engine, store: DestinationStore, reading: Reading, *, at: datetime = NOW, row_id: int = 1, code=None):
    with engine.begin() as connection:
        return store.record(
            connection, DEAD, [Observation(reading, row_id, code, f"attempt of row {row_id}")], now=at, options=OPTIONS
        )


def open_breaker(engine: Engine, store: DestinationStore, *, at: datetime = NOW) -> None:
    for row_id in range(1, OPTIONS.failures + 1):
        record(engine, store, FAILED, at=at, row_id=row_id)


def state_of(engine: Engine, store: DestinationStore):
    with engine.connect() as connection:
        return store.states(connection, [DEAD]).get(DEAD)


def insert_rows(engine: Engine, count: int, *, at: str = DEAD, due: datetime = NOW - timedelta(minutes=1)) -> list[int]:
    statement = insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True)
    rows = [{"target_url": at + "/hook", "payload": {"n": n}, "next_attempt_at": due} for n in range(count)]
    with engine.begin() as connection:
        return list(connection.scalars(statement, rows))


def claim(
    engine: Engine, *, at: datetime, limit: int = 100, cursor: KeyCursor | None = None, cap: int = 100, probes: int = 1,
    rate_limit: RateLimit | None = None,
) -> list[int]:
    """Claim due rows with the drain's own claim statement (``cap``: the cap of a suspect destination; ``probes``:
    the rows sent when a cool-down is over; ``rate_limit``: the destinations' rates); their ids."""
    with engine.begin() as connection:
        rows, _ = queries_for(SampleEvent).claim_due_rows(
            connection, now=at, lease_seconds=60, limit=limit, token=uuid.uuid4(), cursor=cursor,
            cap=cap, probes=probes, rate_limit=rate_limit,
        )
    return [row.id for row in rows]


def insert_ordered(engine: Engine, keys: list[str], *, at: str) -> list[int]:
    statement = insert(OrderedEvent).returning(OrderedEvent.id, sort_by_parameter_order=True)
    rows = [{"target_url": at + "/hook", "stream": key, "payload": {}, "next_attempt_at": NOW - timedelta(minutes=1)}
            for key in keys]
    with engine.begin() as connection:
        return list(connection.scalars(statement, rows))


def claim_ordered(engine: Engine, *, at: datetime, cap: int = 100, rate_limit: RateLimit | None = None) -> list[int]:
    """Claim due heads with the ordered claim statement, as a drainer of its own would (its own cursor)."""
    with engine.begin() as connection:
        rows, _ = queries_for(OrderedEvent).claim_due_rows(
            connection, now=at, lease_seconds=60, limit=20, token=uuid.uuid4(), cap=cap,
            rate_limit=rate_limit,
        )
    return [row.id for row in rows]


def earliest_due(engine: Engine, *, at: datetime, rate_limit: RateLimit | None = None) -> datetime | None:
    with engine.connect() as connection:
        return queries_for(SampleEvent).earliest_due(connection, now=at, rate_limit=rate_limit)


def rows_by_id(engine: Engine) -> dict[int, SampleEvent]:
    with Session(engine) as session:
        return {row.id: row for row in session.scalars(select(SampleEvent))}


# -- the claim leaves blocked destinations out -------------------------------------------------


def test_the_first_outcome_creates_the_state_and_a_run_of_failures_opens_it(engine, store):
    assert state_of(engine, store) is None
    before, after = record(engine, store, FAILED, row_id=1)
    assert before.status == "healthy" and after.consecutive_failures == 1
    open_breaker(engine, store)
    state = state_of(engine, store)
    assert state.status == "open" and state.consecutive_failures == 4
    assert state.opened_at == NOW and state.next_probe_at == NOW + timedelta(seconds=10)
    assert state.last_error == "attempt of row 3" and state.window_failures == 4


def test_an_open_destinations_rows_are_not_claimed_and_keep_their_attempts(engine, store):
    open_breaker(engine, store)
    dead = insert_rows(engine, 5)
    live = insert_rows(engine, 3, at=LIVE)
    assert sorted(claim(engine, at=NOW + timedelta(seconds=1))) == live  # isolation: only the healthy ones
    rows = rows_by_id(engine)
    assert {(rows[row_id].attempts, rows[row_id].claim_token) for row_id in dead} == {(0, None)}
    assert {rows[row_id].next_attempt_at for row_id in dead} == {NOW - timedelta(minutes=1)}  # untouched
    assert earliest_due(engine, at=NOW + timedelta(seconds=1)) == NOW + timedelta(seconds=10)  # its probe, not its rows


def test_a_few_probes_per_cool_down_and_a_success_lets_the_rest_flow(engine, store):
    open_breaker(engine, store)
    dead = insert_rows(engine, 5)
    probe_at = NOW + timedelta(seconds=10)
    assert claim(engine, at=probe_at, probes=3) == dead[:3]  # the oldest due rows, as many as BreakerOptions.probes
    state = state_of(engine, store)
    assert (state.status, state.probe_row_id) == ("half_open", dead[0])
    assert claim(engine, at=probe_at + timedelta(seconds=1), probes=3) == []  # nothing more while they are out
    record(engine, store, SUCCEEDED, at=probe_at + timedelta(seconds=2), row_id=dead[0])
    assert state_of(engine, store).status == "healthy"
    assert sorted(claim(engine, at=probe_at + timedelta(seconds=2))) == dead[3:]


def test_a_failed_probe_reopens_with_a_longer_cool_down(engine, store):
    open_breaker(engine, store)
    dead = insert_rows(engine, 3)
    probe_at = NOW + timedelta(seconds=10)
    [probe] = claim(engine, at=probe_at)
    record(engine, store, FAILED, at=probe_at, row_id=probe)
    state = state_of(engine, store)
    assert state.status == "open" and state.cool_down == 20 and state.next_probe_at is not None
    # The doubled cool-down, up to a quarter sooner (outboxkit.breaker.PROBE_JITTER).
    assert probe_at + timedelta(seconds=15) <= state.next_probe_at <= probe_at + timedelta(seconds=20)
    assert claim(engine, at=state.next_probe_at - timedelta(milliseconds=1)) == []
    assert len(claim(engine, at=state.next_probe_at)) == 1
    assert {row.attempts for row in rows_by_id(engine).values() if row.id not in (probe,)} <= {0, 1}
    assert len(dead) == 3


def test_a_probe_whose_outcome_never_comes_lets_another_go_when_its_lease_ends(engine, store):
    open_breaker(engine, store)
    insert_rows(engine, 3)
    probe_at = NOW + timedelta(seconds=10)
    assert len(claim(engine, at=probe_at)) == 1
    assert claim(engine, at=probe_at + timedelta(seconds=59)) == []
    assert len(claim(engine, at=probe_at + timedelta(seconds=60))) == 1  # the lease ended: another probe


def test_no_probe_goes_inside_a_receivers_retry_after(engine, store):
    open_breaker(engine, store)
    record(engine, store, Reading(Signal.FAILURE, slow_down=600), row_id=4, code=503)
    insert_rows(engine, 2)
    assert state_of(engine, store).status == "open"
    assert claim(engine, at=NOW + timedelta(seconds=31)) == []  # the cool-down is over, the Retry-After is not
    assert earliest_due(engine, at=NOW + timedelta(seconds=31)) == NOW + timedelta(seconds=600)
    assert len(claim(engine, at=NOW + timedelta(seconds=600))) == 1


def test_a_slowed_destination_is_not_claimed_until_its_slow_down_ends(engine, store):
    record(engine, store, Reading(Signal.THROTTLED, slow_down=30), row_id=1, code=429)
    ids = insert_rows(engine, 2)
    assert claim(engine, at=NOW + timedelta(seconds=29)) == []
    assert sorted(claim(engine, at=NOW + timedelta(seconds=30))) == ids


def test_gone_disables_and_only_a_resume_lets_rows_go(engine, store):
    record(engine, store, Reading(Signal.GONE), code=410)
    ids = insert_rows(engine, 2)
    assert claim(engine, at=NOW + timedelta(days=30)) == []
    assert earliest_due(engine, at=NOW) is None  # nothing wakes the loop for it: the resume notifies
    with engine.begin() as connection:
        store.resume(connection, DEAD, now=NOW, actor="alice")
    assert sorted(claim(engine, at=NOW)) == ids


def test_a_person_disables_and_probes_now(engine, store):
    with engine.begin() as connection:
        store.disable(connection, DEAD, now=NOW, actor="bob")
    insert_rows(engine, 2)
    assert claim(engine, at=NOW) == []
    with engine.begin() as connection:
        store.resume(connection, DEAD, now=NOW, actor="bob")
    open_breaker(engine, store)
    with engine.begin() as connection:
        assert store.probe_now(connection, DEAD, now=NOW + timedelta(seconds=1)) is not None
    assert len(claim(engine, at=NOW + timedelta(seconds=1))) == 1


def test_a_state_row_deleted_by_hand_loses_no_row(engine, store):
    open_breaker(engine, store)
    ids = insert_rows(engine, 2)
    with engine.begin() as connection:
        connection.execute(delete(destination_table))
    assert sorted(claim(engine, at=NOW)) == ids


# -- fair and bounded ---------------------------------------------------------------------------


def test_a_backlog_of_one_destination_does_not_delay_anothers_new_row(engine):
    backlog = insert_rows(engine, 200, due=NOW - timedelta(hours=1))
    [new] = insert_rows(engine, 1, at=LIVE, due=NOW)
    first = claim(engine, at=NOW, limit=10)
    assert new in first  # in the first batch, beside the backlog's share of it
    assert sorted(set(first) - {new}) == backlog[:len(first) - 1]  # the backlog's oldest, in order


def test_the_claim_reads_the_state_of_the_destinations_it_walks_not_every_state_stored(engine):
    with engine.begin() as connection:  # 10,000 quiet states of destinations without rows
        connection.execute(text(
            "INSERT INTO outboxkit_destinations (outbox, destination, status, updated_at) "
            "SELECT 'sample-events', 'http://quiet-' || n || '\\:80', 'healthy', now() FROM generate_series(1, 10000) AS n"
        ))
        connection.execute(text("ANALYZE outboxkit_destinations"))
    insert_rows(engine, 5, at=LIVE)
    claim_sql = queries_for(SampleEvent)._claim_driver_sql
    parameters = {"now": NOW, "lease_seconds": 60, "limit": 50, "token": uuid.uuid4(),
                  "outbox": "sample-events", "after": None, "cap": 8, "unknown_suspect": True, "steps": 200, "probes": 3,
                  **rate_parameters(None)}
    with engine.connect() as connection:
        driver = connection.connection.driver_connection
        plan = driver.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_sql, parameters).fetchone()[0][0]["Plan"]
        connection.rollback()

    def nodes(node):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)

    read = sum(node["Actual Rows"] * node["Actual Loops"] for node in nodes(plan)
               if node.get("Relation Name") == "outboxkit_destinations")
    assert read <= 2  # by key, for the one destination walked


def test_the_walk_goes_on_from_where_the_last_claim_stopped(engine):
    names = [f"http://127.0.0.1:{port}" for port in range(8001, 8006)]
    for name in names:
        insert_rows(engine, 3, at=name)
    cursor = KeyCursor()
    seen: list[set[str]] = []
    for _ in range(3):
        ids = claim(engine, at=NOW, limit=2, cursor=cursor)
        rows = rows_by_id(engine)
        seen.append({rows[row_id].destination for row_id in ids})
    assert all(len(batch) == 2 for batch in seen)  # one row of each of two destinations per batch
    assert seen[0] != seen[1] and set().union(*seen) == set(names)  # the walk goes round


# -- races between processes ---------------------------------------------------------------------


def _record_failures(url: str, barrier, results, failures: int, worker: int) -> None:
    engine = create_engine(sqlalchemy_url(url))
    store = DestinationStore(SampleEvent)
    opened = 0
    barrier.wait(timeout=60)
    for attempt in range(failures):
        with engine.begin() as connection:
            before, after = store.record(
                connection, DEAD, [Observation(FAILED, worker * 1000 + attempt, None, "down")], now=NOW, options=OPTIONS
            )
        opened += before.status == "healthy" and after.status == "open"
    engine.dispose()
    results.put(opened)


def _claim_repeatedly(url: str, barrier, results, tries: int, worker: int) -> None:
    engine = create_engine(sqlalchemy_url(url))
    claimed: list[int] = []
    barrier.wait(timeout=60)
    for attempt in range(tries):
        claimed += claim(engine, at=NOW + timedelta(seconds=10, milliseconds=attempt))
    engine.dispose()
    results.put(claimed)


def race(target, database_url: str, count: int) -> list:
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


def test_two_processes_claiming_an_open_destination_at_once_send_exactly_one_probe(engine, store, database_url):
    open_breaker(engine, store)
    insert_rows(engine, 20)
    claimed = race(_claim_repeatedly, database_url, 25)
    assert len(claimed[0]) + len(claimed[1]) == 1  # held_rows_claimed: 0; only the one probe
    assert state_of(engine, store).status == "half_open"


# -- the cap on rows in flight, across processes -----------------------------------------------


def test_a_suspect_destination_has_at_most_its_cap_claimed_across_claims(engine, store):
    """Counted from the live claims in the database, so two drainers (two claims here) together hold at most the cap;
    a recorded outcome frees a place; a destination proven healthy is not capped."""
    record(engine, store, FAILED, row_id=1)  # a failure run: suspect
    with engine.begin() as connection:  # the other one has answered with a success: proven
        store.record(connection, LIVE, [Observation(SUCCEEDED, 2, 200)], now=NOW, options=OPTIONS)
    dead = insert_rows(engine, 6)
    live = insert_rows(engine, 4, at=LIVE)
    first = claim(engine, at=NOW, limit=20, cap=2)
    assert sorted(set(first) & set(dead)) == dead[:2] and set(live) <= set(first)
    insert_rows(engine, 2, at=LIVE)
    second = claim(engine, at=NOW + timedelta(seconds=1), limit=20, cap=2)  # another drainer: the cap is full
    assert not set(second) & set(dead) and len(second) == 2
    with engine.begin() as connection:  # one of the two claimed rows is recorded: a place is free
        connection.execute(text(
            "UPDATE sample_event_outbox SET claim_token = NULL, claimed_until = NULL, next_attempt_at = :later "
            "WHERE id = :id"
        ), {"id": dead[0], "later": NOW + timedelta(hours=1)})
    insert_rows(engine, 1, at=LIVE)
    third = claim(engine, at=NOW + timedelta(seconds=2), limit=20, cap=2)
    assert sorted(set(third) & set(dead)) == [dead[2]]


def test_a_destination_not_yet_proven_is_capped_among_others(engine, store):
    fresh = insert_rows(engine, 5, at=LIVE)
    other = insert_rows(engine, 5)
    taken = claim(engine, at=NOW, limit=20, cap=2)
    assert sorted(taken) == fresh[:2] + other[:2]  # neither has answered a success yet


def test_a_destination_alone_is_not_capped(engine, store):
    record(engine, store, FAILED, row_id=1)
    dead = insert_rows(engine, 6)
    assert sorted(claim(engine, at=NOW, limit=20, cap=2)) == dead


def test_an_ordered_suspect_destinations_heads_stay_under_its_cap_across_two_drainers(engine):
    """The ordered claim keeps the heads of a suspect destination under its room, counted from the live claims of
    every drainer; a proven destination's heads are not capped."""
    store = DestinationStore(OrderedEvent)
    with engine.begin() as connection:  # DEAD has a failure run (suspect), LIVE a success (proven)
        store.record(connection, DEAD, [Observation(FAILED, 1, None, "down")], now=NOW, options=OPTIONS)
        store.record(connection, LIVE, [Observation(SUCCEEDED, 2, 200)], now=NOW, options=OPTIONS)
    dead = insert_ordered(engine, [f"dead-{n}" for n in range(6)], at=DEAD)
    live = insert_ordered(engine, [f"live-{n}" for n in range(4)], at=LIVE)
    first = claim_ordered(engine, at=NOW, cap=2)
    assert len(set(first) & set(dead)) == 2 and set(live) <= set(first)
    more_live = insert_ordered(engine, [f"live-{n}" for n in range(4, 6)], at=LIVE)
    second = claim_ordered(engine, at=NOW + timedelta(seconds=1), cap=2)  # another drainer: the cap is full
    assert sorted(second) == more_live


# -- the one-destination shortcut (outboxkit.storage.destination_claim, ``alone``) --------------


@pytest.fixture
def statements_run(monkeypatch):
    """The claim statements each claim ran, in order: "alone" (the shortcut) or "walk"."""
    queries = queries_for(SampleEvent)
    ran: list[str] = []
    run = queries._run

    def spy(connection, statement, params):
        ran.append("alone" if statement is queries._alone else "walk")
        return run(connection, statement, params)

    monkeypatch.setattr(queries, "_run", spy)
    return ran


def test_a_destination_found_alone_is_claimed_by_the_shortcut(engine, statements_run):
    dead = insert_rows(engine, 6)
    cursor = KeyCursor()
    assert claim(engine, at=NOW, limit=2, cursor=cursor) == dead[:2]
    assert cursor.alone == "http://127.0.0.1:9"
    assert claim(engine, at=NOW, limit=2, cursor=cursor) == dead[2:4]
    assert statements_run == ["walk", "alone"]  # the second claim needed no walk


@pytest.mark.parametrize("other", [LIVE, "http://127.0.0.1:99"], ids=["sorts-before", "sorts-after"])
def test_a_second_destinations_row_ends_the_shortcut_and_shares_the_batch(engine, statements_run, other):
    backlog = insert_rows(engine, 200, due=NOW - timedelta(hours=1))
    cursor = KeyCursor()
    claim(engine, at=NOW, limit=10, cursor=cursor)
    assert cursor.alone is not None
    [new] = insert_rows(engine, 1, at=other, due=NOW)
    second = claim(engine, at=NOW, limit=10, cursor=cursor)
    assert new in second and set(second) - {new} <= set(backlog)  # no starvation behind the backlog
    assert statements_run == ["walk", "alone", "walk"] and cursor.alone is None


def test_an_undecided_row_ends_the_shortcut(engine):
    insert_rows(engine, 20)
    cursor = KeyCursor()
    claim(engine, at=NOW, limit=5, cursor=cursor)
    [undecided] = insert_rows(engine, 1, at=LIVE, due=NOW)
    with engine.begin() as connection:  # a row whose destination could not be decided at insert
        connection.execute(text("UPDATE sample_event_outbox SET destination = NULL WHERE id = :id"), {"id": undecided})
    assert undecided in claim(engine, at=NOW, limit=5, cursor=cursor)


def test_a_blocked_destinations_rows_are_not_claimed_through_the_shortcut(engine, store):
    dead = insert_rows(engine, 6)
    cursor = KeyCursor()
    claim(engine, at=NOW, limit=2, cursor=cursor)
    assert cursor.alone == "http://127.0.0.1:9"
    open_breaker(engine, store)
    assert claim(engine, at=NOW + timedelta(seconds=1), limit=2, cursor=cursor) == []
    rows = rows_by_id(engine)
    assert {(rows[row_id].attempts, rows[row_id].claim_token) for row_id in dead[2:]} == {(0, None)}
    with engine.begin() as connection:  # healthy again, but slowed by a receiver's Retry-After
        connection.execute(text("UPDATE outboxkit_destinations SET status = 'healthy', slowed_until = :until"),
                           {"until": NOW + timedelta(minutes=1)})
    cursor.alone = "http://127.0.0.1:9"
    assert claim(engine, at=NOW + timedelta(seconds=3), limit=2, cursor=cursor) == []
