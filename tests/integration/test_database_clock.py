"""One clock decides: a drainer whose host clock is off the database server's still claims and leases by the server's.

The drainers here are given an ``OffsetClock``: the system clock ten minutes
ahead or behind, as a host whose clock drifted would read it.  Only a
``ManualClock`` (a test's time) overrides the server's clock.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine, insert, text

from outboxkit import Drainer, OutboxKit
from outboxkit.operations.service import OperationsService
from outboxkit.policy import AttemptResult
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.transports.base import CallableTransport, Delivery
from tests.support.clocks import OffsetClock
from tests.support.models import SampleEvent

TEN_MINUTES = timedelta(minutes=10)


def insert_row(engine: Engine, *, due_in: str, in_flight: bool = False) -> int:
    """One SampleEvent row due ``due_in`` after the server's now (an interval); ``in_flight``: claimed elsewhere."""
    with engine.begin() as connection:
        row_id = connection.scalar(
            insert(SampleEvent).returning(SampleEvent.id), {"target_url": "https://receiver.test/hook", "payload": {}}
        )
        claim = ", attempts = 1, claim_token = gen_random_uuid(), claimed_until = now() + CAST(:due_in AS interval)"
        connection.execute(
            text(f"UPDATE sample_event_outbox SET next_attempt_at = now() + CAST(:due_in AS interval)"
                 f"{claim if in_flight else ''} WHERE id = :id"),
            {"due_in": due_in, "id": row_id},
        )
    return row_id


def row(engine: Engine, row_id: int) -> dict:
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT status, attempts, claimed_until - clock_timestamp() AS lease_left, last_error "
                 "FROM sample_event_outbox WHERE id = :id"), {"id": row_id},
        ).mappings().one()
    return dict(found)


def test_a_drainer_whose_clock_runs_ahead_claims_no_row_that_is_not_due_and_no_live_lease(engine):
    later = insert_row(engine, due_in="5 minutes")  # due in 5 minutes: within the 10 the host's clock is ahead
    held = insert_row(engine, due_in="2 minutes", in_flight=True)  # another process's lease, 2 minutes left
    sent: list[str] = []
    transport = CallableTransport(lambda delivery, key: sent.append(key) or 200)
    drainer = Drainer(engine, SampleEvent, transport=transport, clock=OffsetClock(TEN_MINUTES))
    try:
        result = drainer.drain_once()
    finally:
        drainer.close()
    assert result.error is None
    assert (result.claimed, sent) == (0, [])
    assert row(engine, later)["attempts"] == 0
    assert row(engine, held)["attempts"] == 1 and row(engine, held)["lease_left"] > timedelta(minutes=1)


def test_a_drainer_whose_clock_runs_behind_writes_leases_that_hold_by_the_servers_clock(engine):
    due = insert_row(engine, due_in="-1 second")
    leases: list[timedelta] = []
    second: list[int] = []

    def send(delivery: Delivery, key: str) -> int | AttemptResult:
        leases.append(row(engine, due)["lease_left"])
        other = Drainer(engine, SampleEvent, transport=CallableTransport(lambda *_: 200))  # a correct host's drainer
        try:
            second.append(other.drain_once().claimed)  # the row is in flight: its lease holds by the server's clock
        finally:
            other.close()
        return 200

    behind = Drainer(
        engine, SampleEvent, transport=CallableTransport(send), clock=OffsetClock(-TEN_MINUTES),
        options=SampleEvent.__outbox__,
    )
    try:
        result = behind.drain_once()
    finally:
        behind.close()
    assert result.error is None and result.delivered == 1, result
    lease = timedelta(seconds=SampleEvent.__outbox__.lease_seconds)
    assert len(leases) == 1 and timedelta(0) < leases[0] <= lease
    assert second == [0]
    assert row(engine, due)["status"] == "done"


def test_a_drainer_whose_clock_runs_ahead_sends_within_its_lease(engine):
    due = insert_row(engine, due_in="-1 second")
    sent: list[str] = []
    ahead = Drainer(engine, SampleEvent, transport=CallableTransport(lambda d, key: sent.append(key) or 200),
                    clock=OffsetClock(TEN_MINUTES))
    try:
        result = ahead.drain_once()
    finally:
        ahead.close()
    assert result.error is None and len(sent) == 1 and row(engine, due)["status"] == "done"
    with engine.connect() as connection:  # the times Python decides by are the server's, not the host's
        time = DatabaseTime(OffsetClock(TEN_MINUTES))
        server_now = time.read(connection)
    assert abs(time.now() - server_now) < timedelta(seconds=30)


def test_a_reset_from_a_host_whose_clock_runs_ahead_makes_the_row_due_now_by_the_servers_clock(engine):
    stuck = insert_row(engine, due_in="-1 minute")
    with engine.begin() as connection:
        connection.execute(text("UPDATE sample_event_outbox SET status = 'stuck', attempts = 5 WHERE id = :id"), {"id": stuck})
    kit = OutboxKit(engine, [SampleEvent], clock=OffsetClock(TEN_MINUTES))
    try:
        assert OperationsService(kit).reset("sample-events", [stuck], actor="test").changed == 1
    finally:
        kit.close()
    with engine.connect() as connection:
        due_in = connection.execute(
            text("SELECT next_attempt_at - clock_timestamp() FROM sample_event_outbox WHERE id = :id"), {"id": stuck}
        ).scalar_one()
    assert due_in <= timedelta(0)  # due now, not in the ten minutes the host's clock is ahead
