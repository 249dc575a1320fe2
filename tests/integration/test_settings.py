"""Per-outbox overrides from the environment (a retry table, a rate limit) govern a real drain, and the tools'
variables are accepted.

The refusals and the merge rules, on an engine that never connects, are in tests/unit/test_settings.py.
"""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from outboxkit import (
    CallableTransport,
    OutboxKit,
)
from outboxkit.breaker import destination_of
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply


def test_the_overridden_table_governs_a_real_drain(engine, receiver, clock, monkeypatch):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "3")
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__BACKOFF", "7,11")
    receiver.respond = lambda request: Reply(status=503)
    with Session(engine) as session, session.begin():
        session.add(SampleEvent(target_url=f"{receiver.url}/events", payload={"n": 1}, next_attempt_at=clock.now()))
    due_times = []
    with OutboxKit(engine, [SampleEvent], clock=clock) as kit:
        for _ in range(3):
            assert kit.drain_once(SampleEvent).claimed == 1
            with Session(engine) as session:
                row = session.scalars(select(SampleEvent)).one()
            due_times.append(row.next_attempt_at - clock.now())
            clock.set(max(clock.now(), row.next_attempt_at))
    assert due_times[:2] == [timedelta(seconds=7), timedelta(seconds=11)]
    assert (row.status, row.attempts) == ("stuck", 3)
    assert len(receiver.requests) == 3


def test_the_tools_variables_and_any_case_of_a_real_setting_are_accepted(engine, insert_events, clock, monkeypatch):
    """The CLI's and the test suite's own OUTBOXKIT_ variables are not settings and are left alone."""
    for name in ("OUTBOXKIT_APP", "OUTBOXKIT_TEST_PGDATA", "OUTBOXKIT_BENCH_DATABASE_URL", "OUTBOXKIT_FAULT_SEED"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("outboxkit_leader_tick_seconds", "3")
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__MAX_ATTEMPTS", "4")
    insert_events([{"n": 1}])
    with OutboxKit(engine, [SampleEvent], clock=clock, transport=CallableTransport(lambda d, k: 200)) as kit:
        assert kit.settings.leader_tick_seconds == 3
        assert kit.options(SampleEvent).max_attempts == 4
        assert kit.drain_once(SampleEvent).delivered == 1


def test_the_rate_limit_setting_governs_a_real_drain(engine, clock, monkeypatch):
    with Receiver() as limited, Receiver() as free:
        limit = json.dumps({"destinations": {destination_of(limited.url): 1}})
        monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RATE_LIMIT", limit)
        with Session(engine) as session, session.begin():
            for n in range(3):
                session.add(SampleEvent(target_url=f"{limited.url}/events", payload={"n": n}, next_attempt_at=clock.now()))
                session.add(SampleEvent(target_url=f"{free.url}/events", payload={"n": n}, next_attempt_at=clock.now()))
        with OutboxKit(engine, [SampleEvent], clock=clock) as kit:
            assert kit.drain_once(SampleEvent).delivered == 4  # one token for the limited destination, none needed for the other
        assert (len(limited.requests), len(free.requests)) == (1, 3)
        with Session(engine) as session:
            waiting = session.scalars(select(SampleEvent).where(SampleEvent.status == "pending")).all()
        assert [(row.target_url, row.attempts) for row in waiting] == [(f"{limited.url}/events", 0)] * 2
