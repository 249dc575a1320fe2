"""CapWaiting (outboxkit.drain.cap_waiting): rows waiting over a cap go back in one statement, each under its own claim token,
and are counted while they wait.

Real PostgreSQL: the rows are claimed by hand (attempt counted, token and
lease stamped, as the claim does), kept as the pump keeps those the gate put
over a cap (``admitted``), and given back through the real gate; the
statements are counted on the engine.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, event, insert, update

from outboxkit.clock import ManualClock
from outboxkit.destinations.gate import Admission, DestinationGate, Send
from outboxkit.drain.cap_waiting import CapWaiting
from outboxkit.drain.send_pool import InFlightLimit
from outboxkit.policy import AttemptResult
from outboxkit.transports.base import Delivery
from tests.integration.test_destination_drain import give_back_statements
from tests.support.models import SampleEvent

FAILING = "https://failing.example:443"  # its last answer here was a failure: its rows come back one timeout later
NEW = "https://new.example:443"  # not yet proven: its rows come back at once
TIMEOUT = 30.0


@pytest.fixture
def gate(engine: Engine):
    options = dataclasses.replace(SampleEvent.__outbox__, batch_size=10, timeout=TIMEOUT)
    gate = DestinationGate(engine, SampleEvent, options=options)
    yield gate
    gate.close()


def claim(engine: Engine, ids: list[int], token: uuid.UUID, *, attempts: int, until) -> None:
    """What a claim writes: the attempt counted, the token and the lease."""
    with engine.begin() as connection:
        connection.execute(
            update(SampleEvent)
            .where(SampleEvent.id.in_(ids))
            .values(attempts=attempts, claim_token=token, claimed_until=until)
        )


def add_rows(engine: Engine, count: int) -> list[int]:
    with engine.begin() as connection:
        return list(connection.scalars(
            insert(SampleEvent).returning(SampleEvent.id, sort_by_parameter_order=True),
            [{"target_url": f"https://example.test/{n}", "payload": {"n": n}} for n in range(count)],
        ))


def keep_waiting(waiting: CapWaiting, backlog, rows: dict, placed: list[tuple[int, uuid.UUID, str, datetime]]) -> None:
    """Rows the gate put over their cap, ``(row id, claim token, destination, send_by)``, kept as the pump keeps them."""

    def submit(send: Send, token: uuid.UUID) -> None:
        raise AssertionError(f"row {send.row.id} was cleared to go: only waiting rows were expected")

    by_token: dict[uuid.UUID, list[tuple[int, str, datetime]]] = {}
    for row_id, token, destination, send_by in placed:
        by_token.setdefault(token, []).append((row_id, destination, send_by))
    for token, entries in by_token.items():
        over = [(rows[row_id], Delivery(url=rows[row_id].target_url), name) for row_id, name, _ in entries]
        admission = Admission(waiting=over)
        assert waiting.admitted(admission, token, backlog, submit, {row_id: by for row_id, _, by in entries}) == 0


def test_rows_of_several_claims_go_back_in_one_statement_each_under_its_own_token(engine, clock: ManualClock, gate,
                                                                                  read_events):
    now = clock.now()
    lease_end = now + timedelta(seconds=60)
    ids = add_rows(engine, 5)
    first, second, lost = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    claim(engine, ids[:2], first, attempts=1, until=lease_end)
    claim(engine, ids[2:], second, attempts=1, until=lease_end)
    claim(engine, ids[4:], lost, attempts=2, until=lease_end)  # the last row was given back and claimed again meanwhile
    rows = read_events()
    gate.finished(FAILING, 0, AttemptResult(status_code=503), now=now)
    waiting = CapWaiting(gate, InFlightLimit(10), clock=clock, batch_size=10, timeout=TIMEOUT, record_margin=1.0)
    backlog = waiting.backlog()
    placed = [(ids[0], first, FAILING), (ids[1], first, NEW), (ids[2], second, FAILING), (ids[3], second, NEW),
              (ids[4], second, NEW)]
    keep_waiting(waiting, backlog, rows, [(row_id, token, name, lease_end) for row_id, token, name in placed])
    assert waiting.count == len(backlog) == 5
    seen, note = give_back_statements(engine)
    try:
        assert waiting.give_back(backlog) == 5 and not backlog and waiting.count == 0
        gate.settle()  # the give-back runs on the gate's own thread
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert len(seen) == 1  # both claims, both due times: one UPDATE
    after = read_events()
    later = now + timedelta(seconds=TIMEOUT)
    assert [(after[row_id].attempts, after[row_id].next_attempt_at, after[row_id].claim_token) for row_id in ids[:4]] == [
        (0, later, None), (0, now, None), (0, later, None), (0, now, None)
    ]
    assert all(after[row_id].claimed_until is None for row_id in ids[:4])
    kept = after[ids[4]]  # its token is no longer the one it waited with: untouched
    assert (kept.attempts, kept.claim_token, kept.claimed_until, kept.next_attempt_at) == (
        2, lost, lease_end, rows[ids[4]].next_attempt_at
    )


def test_rows_whose_lease_runs_short_go_back_together_and_the_others_keep_waiting(engine, clock: ManualClock, gate,
                                                                                 read_events):
    now = clock.now()
    ids = add_rows(engine, 3)
    tokens = [uuid.uuid4() for _ in ids]
    for row_id, token in zip(ids, tokens, strict=True):
        claim(engine, [row_id], token, attempts=1, until=now + timedelta(seconds=60))
    rows = read_events()
    waiting = CapWaiting(gate, InFlightLimit(10), clock=clock, batch_size=10, timeout=TIMEOUT, record_margin=1.0)
    backlog = waiting.backlog()
    send_by = [now + timedelta(seconds=1), now + timedelta(seconds=2), now + timedelta(seconds=20)]
    keep_waiting(waiting, backlog, rows, [
        (row_id, token, NEW, deadline) for row_id, token, deadline in zip(ids, tokens, send_by, strict=True)
    ])
    seen, note = give_back_statements(engine)
    try:
        assert waiting.expire(backlog) == 0  # none is due to go back yet
        clock.advance(seconds=2)
        assert waiting.expire(backlog) == 2
        gate.settle()
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert len(seen) == 1 and len(backlog) == 1 and waiting.count == 1
    after = read_events()
    assert [(after[row_id].attempts, after[row_id].claim_token) for row_id in ids] == [
        (0, None), (0, None), (1, tokens[2])
    ]
    # A drain call that gave up on a database error: its last row stays claimed until its lease ends, uncounted.
    waiting.forget(backlog)
    assert not backlog and waiting.count == 0
    assert (read_events()[ids[2]].attempts, read_events()[ids[2]].claim_token) == (1, tokens[2])
