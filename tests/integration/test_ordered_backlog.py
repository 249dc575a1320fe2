"""What is due in an outbox with an ordering key: the rows held behind their key's head are not.

A stuck or retrying head holds the rows of its key behind it; they cannot be sent, so the overview's
oldest due row, the lag gauge (and its alert), the minute sample's backlog and "drain now" count only
what a claim could take, and show the held rows apart (``held_by_order``).  Real PostgreSQL, a manual
clock; the rows' due times are set by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, insert, text

from outboxkit import ManualClock
from outboxkit.metrics.prometheus import OutboxMetrics
from outboxkit.storage.attempts import AttemptLog
from outboxkit.storage.drain_queries import rate_parameters
from outboxkit.storage.operator_queries import admin_queries_for
from outboxkit.storage.ordering import DUE_KEY_LIMIT, ordered_statements
from tests.integration.test_model import plan_nodes
from tests.support.admin import AdminHarness
from tests.support.database import sqlalchemy_url
from tests.support.models import OrderedEvent, SampleEvent
from tests.support.ordered_admin import add_ordered, ordered_admin_harness

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
URL = "http://127.0.0.1:9/ordered"  # never sent to: every test reads, none drains


@pytest.fixture
def ordered_admin(database_url) -> Iterator[AdminHarness]:
    with ordered_admin_harness(database_url, clock=ManualClock(NOW)) as harness:
        yield harness


def due_in(engine, ids: list[int], minutes: float) -> None:
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE ordered_event_outbox SET next_attempt_at = :due WHERE id = ANY(:ids)"),
            {"due": NOW + timedelta(minutes=minutes), "ids": ids},
        )


def backlog(engine) -> dict[str, list[int]]:
    """Key a: a stuck head holding two rows due an hour ago.  Key b: a head in backoff holding two rows due
    20 minutes ago.  Key c: a due head (5 minutes) holding one row.  Unkeyed: one due (2 minutes), one in backoff."""
    (a_head,) = add_ordered(engine, [("a", 0)], target_url=URL, status="stuck")
    a_held = add_ordered(engine, [("a", 1), ("a", 2)], target_url=URL)
    b_head, *b_held = add_ordered(engine, [("b", 0), ("b", 1), ("b", 2)], target_url=URL)
    c_head, c_held = add_ordered(engine, [("c", 0), ("c", 1)], target_url=URL)
    unkeyed_due, unkeyed_later = add_ordered(engine, [(None, 0), (None, 1)], target_url=URL)
    due_in(engine, a_held, -60)
    due_in(engine, [b_head], 5)
    due_in(engine, b_held, -20)
    due_in(engine, [c_head], -5)
    due_in(engine, [c_held], -4)
    due_in(engine, [unkeyed_due], -2)
    due_in(engine, [unkeyed_later], 60)
    return {"held": [*a_held, *b_held, c_held], "due": [c_head, unkeyed_due]}


def test_the_overview_counts_only_sendable_rows_as_due_and_shows_the_held_ones(ordered_admin):
    rows = backlog(ordered_admin.engine)

    (box,) = ordered_admin.client.get("/admin/api/outboxes").json()["outboxes"]

    assert box["counts"]["pending"] == 9
    assert (box["counts"]["held_by_order"], box["counts"]["held_by_order_estimated"]) == (len(rows["held"]), False)
    # The oldest due row a claim could take is key c's head, not the rows held an hour behind key a's stuck head.
    assert box["oldest_due_at"] == (NOW - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    assert box["oldest_due_age_seconds"] == 300.0


def test_an_outbox_without_a_key_keeps_its_plain_counts(database_url):
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(SampleEvent), [{"target_url": URL, "next_attempt_at": NOW + timedelta(minutes=m)} for m in (-3, -1, 10)]
            )
            queries = admin_queries_for(SampleEvent)
            counts = queries.status_counts(connection, now=NOW)
            due = queries.count_due(connection, now=NOW, cap=100)
    finally:
        engine.dispose()

    assert (counts.pending, counts.held_by_order, counts.held_by_order_estimated) == (3, None, False)
    assert (counts.oldest_due_at, due) == (NOW - timedelta(minutes=3), 2)


def test_the_lag_gauge_and_the_held_gauge_follow_what_is_sendable(ordered_admin):
    rows = backlog(ordered_admin.engine)
    metrics = OutboxMetrics(ordered_admin.kit, refresh_seconds=3600)
    try:
        metrics.refresh()
        read = metrics.registry.get_sample_value
        labels = {"outbox": "ordered-events"}

        assert read("outboxkit_oldest_due_age_seconds", labels) == 300.0
        assert read("outboxkit_held_by_order_rows", labels) == len(rows["held"])
        assert read("outboxkit_pending_rows", labels) == 9
    finally:
        metrics.close()


def test_drain_now_reports_the_sendable_rows_as_due(ordered_admin):
    rows = backlog(ordered_admin.engine)
    with ordered_admin.engine.connect() as connection:
        due = admin_queries_for(OrderedEvent).count_due(connection, now=NOW, cap=100)
    assert due == len(rows["due"])


def test_the_minute_sample_counts_the_sendable_backlog(ordered_admin):
    backlog(ordered_admin.engine)
    queries = ordered_admin.kit.drainer("ordered-events").queries
    log = AttemptLog("ordered-events", keep_days=7, table=queries.table_name, ordered=queries.ordered)
    with ordered_admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        log.flush(connection, now=NOW)
        sample = connection.execute(
            text("SELECT pending, due, oldest_due_seconds FROM outboxkit_outbox_minutes WHERE outbox = 'ordered-events'")
        ).one()

    assert tuple(sample) == (9, 2, 300.0)


def test_past_the_key_limit_the_held_count_is_a_bound_and_the_lag_is_not_understated(ordered_admin, monkeypatch):
    backlog(ordered_admin.engine)
    monkeypatch.setattr("outboxkit.storage.operator_queries.BACKLOG_KEY_LIMIT", 1)  # the walk sees key a only

    with ordered_admin.engine.connect() as connection:
        counts = admin_queries_for(OrderedEvent).status_counts(connection, now=NOW)

    # Key a's head is stuck: no pending head seen, so every keyed pending row may be held (7, an upper bound).
    assert (counts.held_by_order, counts.held_by_order_estimated) == (7, True)
    # Keys b and c were not walked: their oldest due row (held or not) stands in, 20 minutes old.
    assert counts.oldest_due_at == NOW - timedelta(minutes=20)


def test_a_skipped_head_no_longer_holds_its_key(ordered_admin):
    rows = backlog(ordered_admin.engine)
    (a_head,) = [row_id for row_id, status in _statuses(ordered_admin.engine).items() if status == "stuck"]
    assert ordered_admin.client.post("/admin/api/outboxes/ordered-events/skip", json={"ids": [a_head]}).status_code == 200

    (box,) = ordered_admin.client.get("/admin/api/outboxes").json()["outboxes"]

    assert box["counts"]["held_by_order"] == len(rows["held"]) - 1  # key a's first waiting row is its head now
    assert box["oldest_due_age_seconds"] == 3600.0


def _statuses(engine) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(text("SELECT id, status FROM ordered_event_outbox")).all())


@pytest.mark.parametrize("with_due", [False, True])
def test_the_backlog_reads_keys_not_the_rows_waiting_behind_their_heads(ordered_admin, with_due):
    # One key with 20,000 rows behind a stuck head, and 200 keys of 5 rows each: the count steps over the busy key
    # once, as over any key, so it reads a few index entries per key, never the rows behind a head.
    with ordered_admin.engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO ordered_event_outbox (target_url, stream, payload, status) "
            "SELECT :url, 'busy', '{}', CASE WHEN g = 1 THEN 'stuck' ELSE 'pending' END FROM generate_series(1, 20001) AS g"
        ), {"url": URL})
        connection.execute(text(
            "INSERT INTO ordered_event_outbox (target_url, stream, payload) "
            "SELECT :url, 'k' || (g % 200), '{}' FROM generate_series(1, 1000) AS g"
        ), {"url": URL})
        connection.execute(text("ANALYZE ordered_event_outbox"))
    backlog = ordered_statements(OrderedEvent, "ordered_event_outbox").backlog_sql()
    parameters = {"now": NOW, "outbox": "ordered-events", "key_limit": 1_000, "cap": 100_001, "with_due": with_due}
    with ordered_admin.engine.connect() as connection:
        plan = connection.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + backlog), parameters).scalar_one()[0]["Plan"]
        counts = admin_queries_for(OrderedEvent).status_counts(connection, now=NOW)

    on_the_outbox = [node for node, _ in plan_nodes(plan) if node.get("Relation Name") == "ordered_event_outbox"]
    assert on_the_outbox and not [node for node in on_the_outbox if node["Node Type"] == "Seq Scan"]
    assert sum(node["Actual Rows"] * node["Actual Loops"] for node in on_the_outbox) < 2_000  # 21,001 rows in the table
    assert (counts.held_by_order, counts.held_by_order_estimated) == (20_000 + 800, False)


def test_the_earliest_due_read_walks_a_bounded_number_of_keys(ordered_admin):
    # 2,000 keys of one row each: the read visits DUE_KEY_LIMIT of them (and one more to know there are more), and
    # the keys past them stand in with the oldest pending row, no sooner than a second from now.
    with ordered_admin.engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO ordered_event_outbox (target_url, stream, payload, next_attempt_at) "
            "SELECT :url, 'k' || lpad(g::text, 5, '0'), '{}', :due FROM generate_series(1, 2000) AS g"
        ), {"url": URL, "due": NOW + timedelta(minutes=5)})
        connection.execute(text("ANALYZE ordered_event_outbox"))
    earliest = ordered_statements(OrderedEvent, "ordered_event_outbox").earliest_due_sql()
    with ordered_admin.engine.connect() as connection:
        plan = connection.execute(
            text("EXPLAIN (ANALYZE, FORMAT JSON) " + earliest), {"now": NOW, "outbox": "ordered-events", **rate_parameters(None)}
        ).scalar_one()[0]["Plan"]
        due = connection.execute(text(earliest), {"now": NOW, "outbox": "ordered-events", **rate_parameters(None)}).scalar_one()
    walks = [node for node, _ in plan_nodes(plan) if node["Node Type"] == "Recursive Union"]
    assert walks and all(node["Actual Rows"] <= DUE_KEY_LIMIT + 2 for node in walks)  # 2,000 keys in the table
    assert due == NOW + timedelta(minutes=5)
