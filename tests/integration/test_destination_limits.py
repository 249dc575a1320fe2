"""An operator's limits of a destination, changed while a worker runs: the worker obeys them without a restart.

Real database, a running worker (the kit's drain loop, listening), real receivers on 127.0.0.1.  Nothing sleeps:
each step waits for what the receivers got or what the database holds, and what must not happen is shown by a
later claim that provably walked the limited destination (a row of another destination it delivered).
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.breaker import destination_of
from outboxkit.errors import InvalidValueError, UnknownDestinationError, UnknownOutboxError
from outboxkit.operations.destination_limits import DestinationLimitOperations
from outboxkit.storage import drain_queries
from tests.support.leadership import wait_until
from tests.support.models import SampleEvent
from tests.support.receiver import Receiver, Reply

# Only a wake-up (an insert's, a change's NOTIFY) can make the loop claim within the test: its safety net is an hour
# away.  Sends wait as long as the test needs (a hanging receiver is released at its end).
SETTINGS = OutboxKitSettings(
    drain_interval_seconds=3600, listen_enabled=True,
    outboxes={"sample_events": {"timeout": 60, "concurrency": 32}},
)


@pytest.fixture
def kit(engine):
    kit = OutboxKit(engine, [SampleEvent], settings=SETTINGS)
    yield kit
    kit.close()


@pytest.fixture
def limits(kit) -> DestinationLimitOperations:
    return DestinationLimitOperations(kit)


@pytest.fixture
def other_receiver():
    with Receiver() as receiver:
        yield receiver


def enqueue(engine, receiver: Receiver, count: int, path: str = "/events") -> None:
    with Session(engine) as session, session.begin():
        session.add_all(SampleEvent(target_url=receiver.url + path, payload={"n": n}) for n in range(count))


def pending(engine, destination: str) -> list[tuple[int, bool]]:
    """(attempts, claimed now) of each pending row of ``destination``."""
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT attempts, COALESCE(claimed_until > now(), false) FROM sample_event_outbox WHERE status = 'pending' "
            "AND destination = :destination ORDER BY id"), {"destination": destination})]


def audit(engine) -> list[tuple[str, str, dict]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT actor, action, filter FROM outboxkit_reset_audit ORDER BY id"))]


def test_a_running_worker_obeys_a_rate_set_on_a_destination_and_its_clearing(engine, kit, limits, receiver):
    destination = destination_of(receiver.url)
    kit.worker.start()
    enqueue(engine, receiver, 1)
    receiver.wait_for(lambda r: len(r.requests) == 1)  # no limit: it goes at once
    assert kit.worker.listener.wait_for_generation(1, timeout=10)

    # One request per 1,000 s (a burst of one): after the first, none can go within the test.
    changed = limits.set("sample-events", destination, per_second=0.001, cap=None, actor="alice")
    assert changed.changed and changed.limits.per_second == 0.001 and changed.audit_id is not None
    enqueue(engine, receiver, 5)
    receiver.wait_for(lambda r: len(r.requests) == 2)  # the bucket's one token
    with engine.connect() as connection:
        wait_until(lambda: connection.execute(text(
            "SELECT tokens < 0.5 FROM outboxkit_destination_rates WHERE destination = :destination"),
            {"destination": destination}).scalar() is True, message="the bucket spent")
    wait_until(lambda: len(pending(engine, destination)) == 4, message="the sent row's outcome recorded")
    assert pending(engine, destination) == [(0, False)] * 4  # held back unclaimed: no attempt spent

    # Cleared: back to the outbox's own (no limit), and the sleeping loop is woken to send them at once.
    cleared = limits.clear("sample-events", destination, actor="bob")
    assert cleared.changed and cleared.action == "destination_limit_clear" and cleared.limits.per_second is None
    receiver.wait_for(lambda r: len(r.requests) == 6)
    wait_until(lambda: pending(engine, destination) == [], message="every outcome recorded")
    assert audit(engine) == [
        ("alice", "destination_limit", {"destination": destination, "per_second_before": None, "cap_before": None,
                                         "per_second_after": 0.001, "cap_after": None}),
        ("bob", "destination_limit_clear", {"destination": destination, "per_second_before": 0.001, "cap_before": None,
                                             "per_second_after": None, "cap_after": None}),
    ]


def test_a_running_worker_obeys_a_cap_set_on_a_destination_lowered_and_raised(
    engine, kit, limits, receiver, other_receiver
):
    receiver.respond = lambda request: Reply(hang=True)  # every send to it stays in flight until released
    destination = destination_of(receiver.url)
    kit.worker.start()
    enqueue(engine, receiver, 1)
    receiver.wait_for(lambda r: r.in_flight == 1)
    assert kit.worker.listener.wait_for_generation(1, timeout=10)

    limits.set("sample-events", destination, per_second=None, cap=2, actor="alice")
    enqueue(engine, receiver, 11)
    receiver.wait_for(lambda r: r.in_flight == 2)
    # A row of another destination: the claim that takes it walks the capped one and takes none of its rows.
    enqueue(engine, other_receiver, 1)
    other_receiver.wait_for(lambda r: len(r.requests) == 1)
    assert receiver.max_in_flight == 2
    assert sorted(pending(engine, destination)) == sorted([(1, True)] * 2 + [(0, False)] * 10)

    # Raised above the outbox's own cap (a quarter of 32: 8), live: the woken loop fills it.
    limits.set("sample-events", destination, per_second=None, cap=10, actor="alice")
    receiver.wait_for(lambda r: r.in_flight == 10)
    enqueue(engine, other_receiver, 1)
    other_receiver.wait_for(lambda r: len(r.requests) == 2)
    assert receiver.max_in_flight == 10
    receiver.release()
    receiver.wait_for(lambda r: len(r.requests) == 12)
    wait_until(lambda: pending(engine, destination) == [], message="every row delivered")
    assert receiver.max_in_flight == 10
    assert [(action, entry["cap_before"], entry["cap_after"]) for _, action, entry in audit(engine)] == [
        ("destination_limit", None, 2), ("destination_limit", 2, 10)
    ]


def test_bad_values_and_unknown_names_are_refused_and_change_nothing(engine, kit, limits, receiver):
    destination = destination_of(receiver.url)
    enqueue(engine, receiver, 1)
    for per_second, cap in [(0, None), (-1, None), ("5", None), (float("nan"), None), (None, 0), (None, -2), (None, 1.5),
                            (None, True), (2_000_000, None), (None, 10_001)]:
        with pytest.raises(InvalidValueError):
            limits.set("sample-events", destination, per_second=per_second, cap=cap, actor="alice")
    with pytest.raises(UnknownDestinationError, match="has no destination 'https://nowhere.example:443'"):
        limits.set("sample-events", "https://nowhere.example:443", per_second=1, cap=None, actor="alice")
    with pytest.raises(UnknownOutboxError):
        limits.set("no-such-outbox", destination, per_second=1, cap=None, actor="alice")
    assert audit(engine) == []
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_destination_limits")).scalar_one() == 0


def test_reading_shows_the_operators_limits_beside_the_outboxs_own_and_an_unchanged_set_is_not_audited(
    engine, kit, limits, receiver
):
    destination = destination_of(receiver.url)
    enqueue(engine, receiver, 1)
    shown = limits.get("sample-events", destination)
    assert (shown.per_second, shown.cap, shown.default_per_second, shown.default_cap) == (None, None, None, 8)
    limits.set("sample-events", destination, per_second=5, cap=3, actor="alice")
    again = limits.set("sample-events", destination, per_second=5.0, cap=3, actor="bob")
    assert (again.changed, again.reason, again.audit_id) == (False, "its limits are these already", None)
    shown = limits.get("sample-events", destination)
    assert (shown.per_second, shown.cap, shown.updated_by) == (5.0, 3, "alice")
    assert [action for _, action, _ in audit(engine)] == ["destination_limit"]


# -- in the claim itself, on the manual clock ----------------------------------------------------


def set_limits(engine, outbox: str, destination: str, *, per_second=None, cap=None) -> None:
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO outboxkit_destination_limits (outbox, destination, per_second, cap, updated_by) "
            "VALUES (:outbox, :destination, :per_second, :cap, 'test') ON CONFLICT (outbox, destination) DO UPDATE "
            "SET per_second = excluded.per_second, cap = excluded.cap"),
            {"outbox": outbox, "destination": destination, "per_second": per_second, "cap": cap})


def test_a_drain_call_outside_the_loop_takes_an_operators_rate_once_its_last_answer_is_old(
    engine, make_drainer, clock, receiver, monkeypatch
):
    # A drainer trusts its last answer for OPERATOR_RATES_FRESH_SECONDS (5 s); here it is older at once.
    monkeypatch.setattr(drain_queries, "OPERATOR_RATES_FRESH_SECONDS", 0.0)
    enqueue(engine, receiver, 1)
    drainer = make_drainer()  # the class has no rate limit: its claims take no tokens until one is set
    assert drainer.drain().delivered == 1
    set_limits(engine, "sample-events", destination_of(receiver.url), per_second=2)  # a burst of two
    enqueue(engine, receiver, 5)
    assert drainer.drain().delivered == 2  # the same call: the held-back rows are claimed with their tokens
    assert pending(engine, destination_of(receiver.url)) == [(0, False)] * 3
    clock.advance(seconds=0.5)
    assert drainer.drain().delivered == 1


def test_an_ordered_outboxs_heads_keep_under_an_operators_cap_even_alone(engine):
    from tests.integration.test_destination_store import DEAD, NOW, claim_ordered, insert_ordered

    insert_ordered(engine, [f"key-{n}" for n in range(6)], at=DEAD)
    set_limits(engine, "ordered-events", DEAD, cap=2)
    assert len(claim_ordered(engine, at=NOW)) == 2  # one destination alone, healthy: only the operator's cap holds it
    assert claim_ordered(engine, at=NOW) == []  # both still in flight


def test_an_unordered_destination_alone_keeps_under_an_operators_cap(engine):
    from tests.integration.test_destination_store import DEAD, NOW, claim, insert_rows

    insert_rows(engine, 6, at=DEAD)
    set_limits(engine, "sample-events", DEAD, cap=3)
    from outboxkit.storage.ordering import KeyCursor

    cursor = KeyCursor(alone=DEAD)  # as after a claim that found it alone: the shortcut steps aside for its limits
    assert len(claim(engine, at=NOW, cursor=cursor)) == 3
    assert claim(engine, at=NOW, cursor=cursor) == []
