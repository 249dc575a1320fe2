"""The drain's fast paths (docs/performance.md) keep the behaviour they replaced.

* The HTTP transport's direct path sends what the client path sent (default
  headers, the key, one Content-Type), and an environment proxy is still
  honoured.
* Outcome writes run on an AUTOCOMMIT connection, one statement each; their
  asynchronous commit is local to that statement's transaction.
* ``drain`` keeps the send pool fed: a row the receiver holds does not stop
  the rows claimed after it from being delivered.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from outboxkit import Drainer, HttpTransport
from outboxkit.storage.drain_queries import Outcome, queries_for
from tests.support.models import SampleEvent
from tests.support.receiver import Reply


def insert_events(engine, receiver, count: int) -> list[int]:
    with Session(engine) as session, session.begin():
        rows = [SampleEvent(target_url=f"{receiver.url}/events", payload={"n": n}) for n in range(count)]
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


def statuses(engine) -> dict[int, str]:
    with Session(engine) as session:
        return dict(session.execute(select(SampleEvent.id, SampleEvent.status)).all())


def test_record_outcome_refuses_a_connection_that_would_leave_a_transaction_open(engine, receiver, clock):
    (row_id,) = insert_events(engine, receiver, 1)
    queries = queries_for(SampleEvent)
    outcome = Outcome(row_id=row_id, token=uuid.uuid4(), status="done", next_attempt_at=None, status_code=200, error=None)
    with engine.connect() as connection, pytest.raises(ValueError, match="AUTOCOMMIT"):
        queries.record_outcome(connection, outcome, now=clock.now())
    assert statuses(engine) == {row_id: "pending"}


def test_the_asynchronous_commit_ends_with_the_outcome_transaction(engine, receiver, clock):
    (row_id,) = insert_events(engine, receiver, 1)
    token = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sample_event_outbox SET claim_token = :token WHERE id = :id"), {"token": token, "id": row_id}
        )
    queries = queries_for(SampleEvent, synchronous_commit=False)
    outcome = Outcome(row_id=row_id, token=token, status="done", next_attempt_at=None, status_code=200, error=None)
    with queries.outcome_connection(engine) as connection:
        assert queries.record_outcome(connection, outcome, now=clock.now()) is True
        assert queries.record_outcome(connection, outcome, now=clock.now()) is False  # the claim is spent
        assert connection.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
    with Session(engine) as session:
        row = session.get(SampleEvent, row_id)
        assert (row.status, row.delivered_at, row.claim_token) == ("done", clock.now(), None)


def test_a_held_row_does_not_stop_the_rows_claimed_after_it(engine, receiver, clock):
    ids = insert_events(engine, receiver, 12)
    held = ids[0]
    receiver.respond = lambda request: Reply(hang=True) if request.body["n"] == 0 else Reply()
    options = dataclasses.replace(SampleEvent.__outbox__, batch_size=4, concurrency=2, timeout=30.0)
    with HttpTransport() as transport:
        drainer = Drainer(engine, SampleEvent, transport=transport, clock=clock, options=options)
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.setdefault("result", drainer.drain()), daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            pause = threading.Event()
            while sum(status == "done" for status in statuses(engine).values()) < 11:
                assert time.monotonic() < deadline, "the rows after the held one were not delivered"
                pause.wait(0.02)
            # Eleven rows from three claims are done while the first claim's held row is still out.
            assert statuses(engine)[held] == "pending" and receiver.in_flight == 1
        finally:
            receiver.release()
            thread.join(timeout=30)
            drainer.close()
    result = outcome["result"]
    assert result.delivered == 12 and result.batches >= 3 and result.error is None
    with Session(engine) as session:
        assert session.scalar(select(func.count()).where(SampleEvent.status == "done")) == 12
