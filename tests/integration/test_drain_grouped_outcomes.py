"""Grouped outcome commits (outboxkit.drain.record), against a real database and a real receiver.

* Outcomes that finish together are written in fewer transactions than
  rows, in both commit modes; a group never holds more than ``max_rows``.
* Each row stays guarded by its claim token: a row reset mid-flight is a
  lost claim for that row only, and its group-mates are written.
* One row's failing write (a trigger rejects it) does not lose its
  neighbours' outcomes: the group is written again row by row.
* The wait is bounded: a send still out does not hold back the outcomes of
  the sends that finished.

The receiver holds every request until the test releases them all at once,
so their outcomes reach the recording thread close together.  A trigger
logs the transaction id of each outcome write (the update that clears a
claim token), which is how the tests count transactions.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, event, text

from outboxkit import Drainer, DrainResult, HttpTransport
from outboxkit.breaker import BreakerOptions
from outboxkit.destinations.store import DestinationStore
from outboxkit.drain.record import MAX_GROUP_DELAY_SECONDS, FinishedSend, OutcomeGrouping
from outboxkit.policy import AttemptResult
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply

# The longest wait a group may take: gathering the released outcomes has all the room it can get.
PATIENT = OutcomeGrouping(max_delay=MAX_GROUP_DELAY_SECONDS)

LOG_OUTCOME_WRITES = """
CREATE TABLE outcome_writes (transaction_id bigint NOT NULL, row_id bigint NOT NULL);
CREATE FUNCTION log_outcome_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL THEN
        INSERT INTO outcome_writes VALUES (txid_current(), NEW.id);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER log_outcome_write AFTER UPDATE ON sample_event_outbox
    FOR EACH ROW EXECUTE FUNCTION log_outcome_write();
"""


@pytest.fixture
def outcome_writes(engine: Engine) -> Callable[[], dict[int, int]]:
    """``outcome_writes() -> {row id: transaction id}`` of every outcome written so far."""
    with engine.begin() as connection:
        connection.exec_driver_sql(LOG_OUTCOME_WRITES)

    def outcome_writes() -> dict[int, int]:
        with engine.connect() as connection:
            return dict(connection.execute(text("SELECT row_id, transaction_id FROM outcome_writes")).all())

    return outcome_writes


@pytest.fixture
def transport() -> Iterator[HttpTransport]:
    with HttpTransport() as transport:
        yield transport


def drainer_for(engine, transport, clock, rows: int, grouping: OutcomeGrouping, *, synchronous_commit: bool = True):
    options = dataclasses.replace(SampleEvent.__outbox__, batch_size=rows, concurrency=rows, timeout=60.0)
    return Drainer(
        engine, SampleEvent, transport=transport, clock=clock, options=options,
        outcome_grouping=grouping, synchronous_commit=synchronous_commit,
    )


def reject_done_outcome(engine: Engine, row_id: int) -> None:
    """A trigger that makes every write of ``done`` to row ``row_id`` fail (a constraint that rejects one row)."""
    with engine.begin() as connection:
        connection.exec_driver_sql(f"""
            CREATE FUNCTION reject_one_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.id = {row_id} AND NEW.status = 'done' THEN
                    RAISE EXCEPTION 'row {row_id} may not be done';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER reject_one_outcome BEFORE UPDATE ON sample_event_outbox
                FOR EACH ROW EXECUTE FUNCTION reject_one_outcome();
        """)


def drain_released_together(drainer: Drainer, receiver: Receiver, rows: int, *, before_release=None) -> DrainResult:
    """Drain while the receiver holds every request; once all ``rows`` arrived, release them at once."""
    receiver.respond = lambda request: Reply(hang=True)
    box: dict[str, DrainResult] = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", drainer.drain()), daemon=True)
    thread.start()
    try:
        receiver.wait_for(lambda r: len(r.requests) == rows, timeout=60)
        if before_release is not None:
            before_release()
    finally:
        receiver.release()
        thread.join(timeout=120)
        drainer.close()
    assert not thread.is_alive(), "the drain did not return"
    return box["result"]


def statuses(engine: Engine) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(text("SELECT id, status FROM sample_event_outbox")).all())


@pytest.mark.parametrize("synchronous_commit", [True, False], ids=["synchronous", "asynchronous"])
def test_outcomes_that_finish_together_share_a_transaction(
    engine, insert_events, receiver, clock, transport, outcome_writes, synchronous_commit
):
    ids = insert_events([{"n": n} for n in range(8)])
    drainer = drainer_for(engine, transport, clock, 8, PATIENT, synchronous_commit=synchronous_commit)

    result = drain_released_together(drainer, receiver, 8)

    assert result.delivered == 8 and not result.errors
    assert statuses(engine) == dict.fromkeys(ids, "done")
    writes = outcome_writes()
    assert sorted(writes) == ids
    assert len(set(writes.values())) < len(ids)  # fewer outcome transactions than rows


def test_a_group_holds_at_most_max_rows(engine, insert_events, receiver, clock, transport, outcome_writes):
    ids = insert_events([{"n": n} for n in range(6)])
    drainer = drainer_for(engine, transport, clock, 6, OutcomeGrouping(max_rows=2, max_delay=MAX_GROUP_DELAY_SECONDS))

    result = drain_released_together(drainer, receiver, 6)

    assert result.delivered == 6
    per_transaction: dict[int, int] = {}
    for transaction_id in outcome_writes().values():
        per_transaction[transaction_id] = per_transaction.get(transaction_id, 0) + 1
    assert sum(per_transaction.values()) == len(ids)
    assert max(per_transaction.values()) <= 2


def test_a_row_claimed_again_mid_flight_is_a_lost_claim_alone(
    engine, insert_events, read_events, receiver, clock, transport, outcome_writes
):
    ids = insert_events([{"n": n} for n in range(6)])
    taken_id = ids[2]
    drainer = drainer_for(engine, transport, clock, 6, PATIENT)
    new_token = uuid.uuid4()

    def claim_one_row_again() -> None:
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE sample_event_outbox SET claim_token = :token, attempts = attempts + 1 WHERE id = :id"),
                {"id": taken_id, "token": new_token},
            )

    result = drain_released_together(drainer, receiver, 6, before_release=claim_one_row_again)

    assert result.lost_claims == 1 and result.delivered == 5 and not result.errors
    rows = read_events()
    taken = rows[taken_id]
    assert (taken.status, taken.claim_token, taken.attempts, taken.delivered_at) == ("pending", new_token, 2, None)
    assert {row_id: rows[row_id].status for row_id in ids if row_id != taken_id} == dict.fromkeys(
        set(ids) - {taken_id}, "done"
    )
    writes = outcome_writes()
    assert taken_id not in writes and len(set(writes.values())) < len(writes)  # its group-mates were still grouped


def test_a_write_that_fails_for_one_row_keeps_its_neighbours_outcomes(
    engine, insert_events, read_events, receiver, clock, transport, caplog
):
    ids = insert_events([{"n": n} for n in range(6)])
    rejected_id = ids[3]
    reject_done_outcome(engine, rejected_id)
    drainer = drainer_for(engine, transport, clock, 6, PATIENT)

    with caplog.at_level(logging.WARNING, logger="outboxkit.drain"):
        result = drain_released_together(drainer, receiver, 6)

    # Usually the six outcomes are written as a group whose write fails and is retried row by row; a busy host
    # may finish them apart, and each row's own write then fails or succeeds alone.  Either way the neighbours keep
    # their outcomes.
    assert result.delivered == 5 and result.lost_claims == 0
    assert len(result.errors) == 1 and f"row {rejected_id}:" in result.errors[0]
    rows = read_events()
    rejected = rows[rejected_id]
    # Its outcome was not written: it keeps its claim and comes due again when the lease ends.
    assert rejected.status == "pending" and rejected.claim_token is not None and rejected.attempts == 1
    assert {row_id: rows[row_id].status for row_id in ids if row_id != rejected_id} == dict.fromkeys(
        set(ids) - {rejected_id}, "done"
    )


def test_a_send_still_out_does_not_hold_back_the_finished_outcomes(engine, insert_events, receiver, clock, transport):
    ids = insert_events([{"n": n} for n in range(5)])
    held_id = ids[0]
    receiver.respond = lambda request: Reply(hang=True) if request.body["n"] == 0 else Reply()
    drainer = drainer_for(engine, transport, clock, 5, PATIENT)
    box: dict[str, DrainResult] = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", drainer.drain()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while statuses(engine) != {held_id: "pending", **dict.fromkeys(ids[1:], "done")}:
            assert time.monotonic() < deadline, f"the finished outcomes were not written: {statuses(engine)}"
            time.sleep(0.05)
        assert receiver.in_flight == 1  # the held send is still out, and its neighbours are recorded
    finally:
        receiver.release()
        thread.join(timeout=120)
        drainer.close()
    assert box["result"].delivered == 5
    assert statuses(engine) == dict.fromkeys(ids, "done")


def test_a_connection_lost_during_a_group_write_loses_no_row(engine, insert_events, read_events, receiver, clock, transport):
    ids = insert_events([{"n": n} for n in range(6)])
    with engine.begin() as connection:  # the first outcome write kills its own session, once
        connection.exec_driver_sql("""
            CREATE SEQUENCE outcome_writes_seen;  -- not rolled back with the killed transaction
            CREATE FUNCTION kill_the_outcome_session() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL AND nextval('outcome_writes_seen') = 1 THEN
                    PERFORM pg_terminate_backend(pg_backend_pid());
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER kill_the_outcome_session BEFORE UPDATE ON sample_event_outbox
                FOR EACH ROW EXECUTE FUNCTION kill_the_outcome_session();
        """)
    drainer = drainer_for(engine, transport, clock, 6, PATIENT)

    result = drain_released_together(drainer, receiver, 6)

    assert result.error is not None and result.delivered == 0
    assert result.errors and result.errors[0].startswith("row(s) ")
    rows = read_events()
    # Nothing was written: every row keeps its claim and comes due again when its lease ends.
    assert all(rows[row_id].status == "pending" and rows[row_id].claim_token is not None for row_id in ids)

    clock.advance(seconds=drainer.options.lease_seconds)
    receiver.respond = lambda request: Reply()
    again = drainer_for(engine, transport, clock, 6, PATIENT)
    try:
        assert again.drain().delivered == 6
    finally:
        again.close()
    assert statuses(engine) == dict.fromkeys(ids, "done")
    assert all(count == 2 for count in receiver.count_by_key().values())  # sent again with the same key


def test_error_texts_and_retry_times_are_written_exactly_in_the_rows_and_the_attempt_history(
    engine, insert_events, read_events, receiver, clock, transport
):
    # The grouped write and the attempt history pass their arrays as literals (outboxkit.storage.array_literals):
    # quotes, backslashes, braces, commas and NULL-like words in an error come back as they were.
    bodies = ['say "no"', "back\\slash \\\"", "{braces},commas", "NULL", "null", "ü €", ""]
    ids = insert_events([{"n": n} for n in range(len(bodies))])
    receiver.respond = lambda request: Reply(status=500, body=bodies[request.body["n"]].encode())
    options = dataclasses.replace(SampleEvent.__outbox__, breaker=None)  # every failure is written in a group
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options, outcome_grouping=PATIENT)
    try:
        result = drainer.drain()
    finally:
        drainer.close()

    assert result.retried == len(bodies) and not result.errors
    rows = read_events()
    expected = {row_id: f"HTTP 500: {body}" if body else "HTTP 500" for row_id, body in zip(ids, bodies, strict=True)}
    assert {row_id: rows[row_id].last_error for row_id in ids} == expected
    assert all(rows[row_id].status == "pending" and rows[row_id].next_attempt_at > clock.now() for row_id in ids)
    with engine.connect() as connection:
        history = dict(connection.execute(text("SELECT row_id, error FROM outboxkit_attempts")).all())
    assert history == expected


def test_a_group_whose_write_fails_is_written_again_row_by_row(
    engine, insert_events, read_events, clock, transport, caplog
):
    """The grouped-failure path itself, with the group made by the test: no timing decides whether it is taken."""
    ids = insert_events([{"n": n} for n in range(6)])
    rejected_id = ids[3]
    token = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sample_event_outbox SET claim_token = :token, claimed_until = :until, attempts = 1"),
            {"token": token, "until": clock.now() + timedelta(hours=1)},
        )
    reject_done_outcome(engine, rejected_id)
    claimed = read_events()
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock)
    finished = [FinishedSend(row=claimed[row_id], token=token, attempt=AttemptResult(status_code=200)) for row_id in ids]
    result = DrainResult(job_name=drainer.job_name)

    with caplog.at_level(logging.WARNING, logger="outboxkit.drain"), drainer.queries.outcome_connection(engine) as connection:
        decisions = drainer.recorder.record_group(connection, finished, result)

    assert any("could not record a group of 6 outcomes" in record.getMessage() for record in caplog.records)
    assert len(decisions) == 5 and result.delivered == 5 and result.lost_claims == 0
    assert len(result.errors) == 1 and f"row {rejected_id}:" in result.errors[0]
    rows = read_events()
    assert rows[rejected_id].status == "pending" and rows[rejected_id].claim_token == token  # keeps its lease
    assert {row_id: rows[row_id].status for row_id in ids if row_id != rejected_id} == dict.fromkeys(
        set(ids) - {rejected_id}, "done"
    )


def claimed_group(engine: Engine, clock, read_events, ids: list[int]) -> tuple[uuid.UUID, dict]:
    """Every row claimed under one token, as one claim leaves them; the rows as claimed."""
    token = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sample_event_outbox SET claim_token = :token, claimed_until = :until, attempts = 1"),
            {"token": token, "until": clock.now() + timedelta(hours=1)},
        )
    return token, read_events()


def state_writes(engine: Engine) -> list[str]:
    """The UPDATE statements on destination state this engine runs from now on (the drain's own connections)."""
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: statements.append(statement)
                 if statement.lstrip().startswith("UPDATE outboxkit_destinations") else None)
    return statements


def test_a_groups_outcomes_change_their_destinations_state_once_in_their_order(
    engine, insert_events, read_events, clock, transport
):
    """Failures and a success of one destination in one group: one state write, as if applied one by one."""
    ids = insert_events([{"n": n} for n in range(4)])
    token, claimed = claimed_group(engine, clock, read_events, ids)
    options = dataclasses.replace(SampleEvent.__outbox__, breaker=BreakerOptions(failures=10))
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options)
    answers = [503, 503, 200, 503]
    finished = [
        FinishedSend(row=claimed[row_id], token=token, attempt=AttemptResult(status_code=code),
                     destination=claimed[row_id].destination)
        for row_id, code in zip(ids, answers, strict=True)
    ]
    writes = state_writes(engine)
    result = DrainResult(job_name=drainer.job_name)
    try:
        with drainer.queries.outcome_connection(engine) as connection:
            decisions = drainer.recorder.record_group(connection, finished, result)
    finally:
        drainer.close()

    assert len(decisions) == 4 and result.delivered == 1 and result.retried == 3 and not result.errors
    assert len(writes) == 1  # the state read once, the four outcomes applied, written once
    with engine.connect() as connection:
        (state,) = DestinationStore(SampleEvent).all_states(connection)
    # In order: two failures, a success that ends the run, one failure: a run of one.
    assert state.consecutive_failures == 1 and state.status == "healthy" and state.last_success_at is not None


def test_a_group_with_destination_states_whose_write_fails_is_written_again_row_by_row(
    engine, insert_events, read_events, clock, transport, caplog
):
    ids = insert_events([{"n": n} for n in range(4)])
    token, claimed = claimed_group(engine, clock, read_events, ids)
    reject_done_outcome(engine, ids[1])
    options = dataclasses.replace(SampleEvent.__outbox__, breaker=BreakerOptions(failures=10))
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options)
    answers = [503, 200, 503, 503]  # the success is the row whose write is rejected
    finished = [
        FinishedSend(row=claimed[row_id], token=token, attempt=AttemptResult(status_code=code),
                     destination=claimed[row_id].destination)
        for row_id, code in zip(ids, answers, strict=True)
    ]
    result = DrainResult(job_name=drainer.job_name)
    try:
        with caplog.at_level(logging.WARNING, logger="outboxkit.drain"), \
                drainer.queries.outcome_connection(engine) as connection:
            decisions = drainer.recorder.record_group(connection, finished, result)
    finally:
        drainer.close()

    assert any("with their destinations' states" in record.getMessage() for record in caplog.records)
    assert len(decisions) == 3 and result.retried == 3 and len(result.errors) == 1
    rows = read_events()
    assert rows[ids[1]].status == "pending" and rows[ids[1]].claim_token == token  # keeps its lease
    assert all(rows[row_id].claim_token is None for row_id in (ids[0], ids[2], ids[3]))
    with engine.connect() as connection:
        (state,) = DestinationStore(SampleEvent).all_states(connection)
    assert state.consecutive_failures == 3  # each failure written with its state; the rejected success not at all
