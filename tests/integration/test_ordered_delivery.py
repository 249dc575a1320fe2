"""Ordered delivery by key (``OutboxOptions.ordering_key``, ``outboxkit.storage.ordering``), against real PostgreSQL and a
real receiver.

Rows sharing a key go one at a time in id order; a retrying row holds its successors; a stuck head blocks its
key until a person retries or skips it; NULL keys are unordered; a busy key does not hold back the others.
Time moves only through the injected ``ManualClock``; the two-process run is in test_ordered_processes.py.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Delivery, Drainer, HttpTransport, Outbox, OutboxOptions
from outboxkit.errors import ConfigurationError
from tests.integration.test_model import plan_nodes
from tests.support.models import OrderedEvent
from tests.support.receiver import Reply


@pytest.fixture
def insert_ordered(engine, receiver):
    """``insert_ordered([(stream, n), ...]) -> [id, ...]``: OrderedEvent rows aimed at the receiver, in that id order."""

    def insert_ordered(rows, *, next_attempt_at=None):
        values = [{"target_url": receiver.url + "/ordered", "stream": stream, "payload": {"stream": stream, "n": n}}
                  for stream, n in rows]
        if next_attempt_at is not None:
            for value in values:
                value["next_attempt_at"] = next_attempt_at
        statement = insert(OrderedEvent).returning(OrderedEvent.id, sort_by_parameter_order=True)
        with engine.begin() as connection:
            return list(connection.scalars(statement, values))

    return insert_ordered


@pytest.fixture
def read_ordered(engine):
    def read_ordered():
        with Session(engine) as session:
            return {row.id: row for row in session.scalars(select(OrderedEvent).order_by(OrderedEvent.id))}

    return read_ordered


@pytest.fixture
def make_ordered_drainer(engine, clock):
    made = []

    def make(**overrides):
        options = dataclasses.replace(OrderedEvent.__outbox__, **overrides)
        transport = HttpTransport()
        drainer = Drainer(engine, OrderedEvent, transport=transport, clock=clock, options=options)
        made.append((drainer, transport))
        return drainer

    yield make
    for drainer, transport in made:
        drainer.close()
        transport.close()


def arrivals_by_stream(receiver):
    """stream -> the ``n`` of each request that arrived for it, in arrival order (retries included)."""
    arrived = defaultdict(list)
    for request in sorted(receiver.requests, key=lambda request: request.received_at):
        arrived[request.body["stream"]].append(request.body["n"])
    return arrived


def order_violations(receiver) -> int:
    """Requests that arrived after a request for a later row of their stream (NULL streams are unordered)."""
    violations = 0
    for stream, numbers in arrivals_by_stream(receiver).items():
        if stream is None:
            continue
        violations += sum(1 for earlier, later in zip(numbers, numbers[1:], strict=False) if later < earlier)
    return violations


def test_rows_of_one_key_arrive_in_id_order_one_at_a_time(insert_ordered, read_ordered, make_ordered_drainer, receiver):
    streams = ["a", "b", "c", "d"]
    insert_ordered([(stream, n) for n in range(8) for stream in streams])
    in_flight: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)

    def respond(request):
        stream = request.body["stream"]
        in_flight[stream] += 1
        most[stream] = max(most[stream], in_flight[stream])
        time.sleep(0.01)  # long enough for a second send of the same stream to overlap, were one made
        in_flight[stream] -= 1
        return Reply()

    receiver.respond = respond
    result = make_ordered_drainer(concurrency=8, batch_size=8).drain()

    assert result.error is None and result.delivered == 32
    assert {row.status for row in read_ordered().values()} == {"done"}
    assert arrivals_by_stream(receiver) == {stream: list(range(8)) for stream in streams}
    assert max(most.values()) == 1


def test_a_retrying_row_holds_its_successors_and_other_keys_go_on(
    insert_ordered, read_ordered, make_ordered_drainer, receiver, clock
):
    ids = insert_ordered([("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)])
    receiver.respond = lambda request: Reply(status=503) if request.body == {"stream": "a", "n": 0} else Reply()
    drainer = make_ordered_drainer()

    result = drainer.drain()

    rows = read_ordered()
    assert result.retried == 1
    assert rows[ids[0]].status == "pending" and rows[ids[0]].attempts == 1
    assert [rows[row_id].attempts for row_id in ids[1:3]] == [0, 0]  # held: never claimed, no attempt spent
    assert [rows[row_id].status for row_id in ids[3:]] == ["done", "done"]  # another key is not held back
    receiver.respond = lambda request: Reply()
    clock.advance(timedelta(seconds=1))  # the retry's backoff
    drainer.drain()
    assert {row.status for row in read_ordered().values()} == {"done"}
    assert arrivals_by_stream(receiver)["a"] == [0, 0, 1, 2]


def test_a_stuck_head_blocks_its_key_until_skipped_and_the_skipped_row_stays(
    engine, insert_ordered, read_ordered, make_ordered_drainer, receiver
):
    ids = insert_ordered([("a", 0), ("a", 1), ("a", 2), ("b", 0)])
    receiver.respond = lambda request: Reply(status=400) if request.body == {"stream": "a", "n": 0} else Reply()
    drainer = make_ordered_drainer()

    drainer.drain()
    drainer.drain()  # nothing more is claimable: the stuck head blocks "a"

    rows = read_ordered()
    assert rows[ids[0]].status == "stuck"
    assert [(rows[row_id].status, rows[row_id].attempts) for row_id in ids[1:3]] == [("pending", 0), ("pending", 0)]
    assert rows[ids[3]].status == "done"
    with engine.begin() as connection:  # what the operator's skip writes (outboxkit.operations)
        connection.execute(
            text("INSERT INTO outboxkit_ordering_skips (outbox, row_id, skipped_by) VALUES ('ordered-events', :id, 'test')"),
            {"id": ids[0]},
        )
    drainer.drain()

    rows = read_ordered()
    assert rows[ids[0]].status == "stuck"  # skipped, never deleted or sent again
    assert [rows[row_id].status for row_id in ids[1:3]] == ["done", "done"]
    assert arrivals_by_stream(receiver)["a"] == [0, 1, 2]


def test_rows_without_a_key_are_unordered(insert_ordered, read_ordered, make_ordered_drainer, receiver):
    ids = insert_ordered([(None, n) for n in range(6)])
    receiver.respond = lambda request: Reply(status=503) if request.body["n"] == 0 else Reply()

    result = make_ordered_drainer().drain()

    rows = read_ordered()
    assert result.delivered == 5 and rows[ids[0]].status == "pending"  # the first row retries; the others went
    assert [rows[row_id].status for row_id in ids[1:]] == ["done"] * 5


def test_a_busy_key_does_not_hold_back_the_others(insert_ordered, read_ordered, make_ordered_drainer, receiver):
    # One key with a long backlog inserted first, then one row for each of many keys: each claim walks the keys in
    # turn from where the last one stopped, so the other keys are served within the first rounds, not after the backlog.
    insert_ordered([("busy", n) for n in range(200)])
    insert_ordered([(f"k{index:03d}", 0) for index in range(60)])
    drainer = make_ordered_drainer(batch_size=20, concurrency=20)

    result = drainer.drain()

    assert result.delivered == 260
    busy_before_last_other = 0
    last_other = max(index for index, request in enumerate(sorted(receiver.requests, key=lambda r: r.received_at))
                     if request.body["stream"] != "busy")
    for request in sorted(receiver.requests, key=lambda r: r.received_at)[:last_other]:
        busy_before_last_other += request.body["stream"] == "busy"
    assert busy_before_last_other <= 10  # at most one busy row per claim before every other key was served
    assert order_violations(receiver) == 0


def test_a_bad_ordering_key_is_refused_when_the_class_is_defined():
    class Base(DeclarativeBase):
        pass

    with pytest.raises(ConfigurationError, match="ordering_key 'acount_id' is not a column of the class.*account_id"):

        class Misspelt(Outbox, Base):
            __tablename__ = "misspelt_outbox"
            __outbox__ = OutboxOptions(job_name="misspelt", ordering_key="acount_id")
            account_id: Mapped[int | None] = mapped_column()

            def build_delivery(self) -> Delivery:
                return Delivery(url="http://127.0.0.1:1/")

    with pytest.raises(ConfigurationError, match="ordering_key 'status' is one of the kit's own columns"):

        class KitColumn(Outbox, Base):
            __tablename__ = "kit_column_outbox"
            __outbox__ = OutboxOptions(job_name="kit-column", ordering_key="status")

            def build_delivery(self) -> Delivery:
                return Delivery(url="http://127.0.0.1:1/")

    with pytest.raises(ConfigurationError, match="ordering_key must be None or the attribute name"):
        OutboxOptions(job_name="bad", ordering_key="account id")
    assert "misspelt_outbox" not in Base.metadata.tables  # a refused class leaves no table behind


def test_the_ordered_claim_reads_keys_not_the_rows_waiting_behind_their_heads(engine):
    # One key with 10,000 rows behind a head in flight, and 1,000 keys of 10 rows each, all due.  The claim steps
    # over the busy key once, as it steps over any key, and reads a batch's worth of heads from the order index.
    from outboxkit.storage.drain_queries import ordered_claim_sql, queries_for, rate_parameters

    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO ordered_event_outbox (target_url, stream, payload) "
            "SELECT 'http://127.0.0.1:1/e', 'busy', '{}' FROM generate_series(1, 10000)"
        ))
        connection.execute(text(
            "UPDATE ordered_event_outbox SET next_attempt_at = now() + interval '1 hour', claimed_until = now() + "
            "interval '1 hour', claim_token = gen_random_uuid() WHERE id = (SELECT min(id) FROM ordered_event_outbox)"
        ))
        connection.execute(text(
            "INSERT INTO ordered_event_outbox (target_url, stream, payload) "
            "SELECT 'http://127.0.0.1:1/e', 'k' || (g % 1000), '{}' FROM generate_series(1, 10000) AS g"
        ))
        connection.execute(text("ANALYZE ordered_event_outbox"))
    queries = queries_for(OrderedEvent)
    claim = ordered_claim_sql(queries.ordered)
    now = datetime.now(timezone.utc) + timedelta(minutes=1)  # every row due, the busy key's head still in flight
    parameters = {"now": now, "lease_until": now + timedelta(minutes=1), "limit": 50,
                  "token": "00000000-0000-0000-0000-000000000001", "after": None, "outbox": "ordered-events",
                  "cap": 8, "unknown_suspect": True, **rate_parameters(None)}
    connection = engine.connect()
    try:  # EXPLAIN ANALYZE runs the claim: roll it back
        plan = connection.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + claim), parameters).scalar_one()[0]["Plan"]
    finally:
        connection.rollback()
        connection.close()
    on_the_outbox = [node for node, _ in plan_nodes(plan) if node.get("Relation Name") == "ordered_event_outbox"]
    assert on_the_outbox and not [node for node in on_the_outbox if node["Node Type"] == "Seq Scan"]
    read = sum(node["Actual Rows"] * node["Actual Loops"] for node in on_the_outbox)
    assert read < 2_000  # a few index entries per key visited, against 20,000 rows in the table
    assert plan["Actual Rows"] == 50
    assert {node["Index Name"] for node in on_the_outbox if "Index Name" in node} >= {"ix_ordered_event_outbox_order"}


def test_drain_until_idle_stops_at_rows_behind_a_stuck_head_and_counts_them(engine, insert_ordered, receiver, clock):
    from outboxkit import OutboxKit, OutboxKitSettings
    from outboxkit.testing import drain_until_idle

    insert_ordered([("a", 0), ("a", 1), ("a", 2), ("b", 0)])
    receiver.respond = lambda request: Reply(status=400) if request.body == {"stream": "a", "n": 0} else Reply()
    kit = OutboxKit(engine, [OrderedEvent], settings=OutboxKitSettings(), clock=clock)
    try:
        report = drain_until_idle(kit)
    finally:
        kit.close()

    assert report.pending == 2  # behind the stuck head: waiting, not "due but never claimed"
    assert report.delivered == 1 and report.rounds == 1
    assert [request.body["n"] for request in receiver.requests if request.body["stream"] == "a"] == [0]


def test_a_row_replayed_or_reset_behind_a_row_in_flight_waits_for_it(insert_ordered, read_ordered, engine, clock):
    """At most one row per key in flight: a row made pending again before its key's row in flight (a replay of a
    delivered row, a reset skipped row) is not its key's claimable head until that row is recorded."""
    import uuid

    from outboxkit.storage.drain_queries import queries_for

    queries = queries_for(OrderedEvent)
    first, second = insert_ordered([("a", 0), ("a", 1)])
    now = clock.now()

    def claim(at):
        with engine.begin() as connection:
            rows, _ = queries.claim_due_rows(
                connection, now=at, lease_seconds=60, limit=10, token=uuid.uuid4()
            )
        return [row.id for row in rows]

    assert claim(now) == [first]
    with engine.begin() as connection:  # delivered, then the second row is claimed and out
        connection.execute(text("UPDATE ordered_event_outbox SET status = 'done', claim_token = NULL, "
                                "claimed_until = NULL WHERE id = :id"), {"id": first})
    assert claim(now) == [second]
    with engine.begin() as connection:  # a person replays the first row while the second is in flight
        connection.execute(text("UPDATE ordered_event_outbox SET status = 'pending', next_attempt_at = :now "
                                "WHERE id = :id"), {"id": first, "now": now})
    assert claim(now + timedelta(seconds=1)) == []  # not while a row of its key is in flight
    with engine.begin() as connection:  # the second row's outcome: delivered
        connection.execute(text("UPDATE ordered_event_outbox SET status = 'done', claim_token = NULL, "
                                "claimed_until = NULL WHERE id = :id"), {"id": second})
    assert claim(now + timedelta(seconds=2)) == [first]
