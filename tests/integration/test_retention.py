"""Retention of delivered rows (``outboxkit.leader.retention``), against the real database.

Only ``done`` rows delivered before the cutoff go; pending and stuck rows stay
whatever their timestamps say, and so do recent done rows.  Deletion runs in
batches with a bounded total per run, and the job's count lands in the run
history.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, text

from outboxkit import ConfigurationError, OutboxKit, OutboxKitSettings
from outboxkit.leader.retention import RetentionLimits, delete_delivered_rows, retention_job_id
from tests.support.lock_waits import wait_for_a_lock_wait
from tests.support.models import SampleEvent

DAY = 86400.0


def add_rows(
    engine: Engine, count: int, *, status: str, age: timedelta, now: datetime, delivered: bool | None = None
) -> list[int]:
    """``count`` sample rows created ``age`` before ``now``; done rows (or ``delivered=True``) delivered then too."""
    moment = now - age
    delivered_at = moment if (status == "done" if delivered is None else delivered) else None
    with engine.begin() as connection:
        return list(
            connection.execute(
                text(
                    "INSERT INTO sample_event_outbox (target_url, payload, status, attempts, created_at, updated_at, "
                    "next_attempt_at, delivered_at) "
                    "SELECT 'http://127.0.0.1:1/e', '{}', :status, 1, :moment, :moment, :moment, :delivered_at "
                    "FROM generate_series(1, :count) ORDER BY 1 RETURNING id"
                ),
                {"status": status, "moment": moment, "delivered_at": delivered_at, "count": count},
            ).scalars()
        )


def remaining(engine: Engine) -> set[int]:
    with engine.connect() as connection:
        return set(connection.execute(text("SELECT id FROM sample_event_outbox")).scalars())


def kit_with_retention(engine: Engine, clock, retain_done_for: object) -> OutboxKit:
    settings = OutboxKitSettings(outboxes={"sample_events": {"retain_done_for": retain_done_for}})
    return OutboxKit(engine, [SampleEvent], settings=settings, clock=clock)


@pytest.fixture
def kit(engine: Engine, clock) -> Iterator[OutboxKit]:
    kit = kit_with_retention(engine, clock, 7 * DAY)
    yield kit
    kit.close()


# -- what is deleted -------------------------------------------------------------


def test_only_done_rows_delivered_before_the_cutoff_are_deleted(engine, clock):
    now = clock.now()
    old_done = add_rows(engine, 30, status="done", age=timedelta(days=10), now=now)
    # Worst cases for a careless DELETE: pending and stuck rows that are old
    # and even carry an old delivered_at (an operator's hand edit).
    old_pending = add_rows(engine, 5, status="pending", age=timedelta(days=10), now=now, delivered=True)
    old_stuck = add_rows(engine, 5, status="stuck", age=timedelta(days=10), now=now, delivered=True)
    recent_done = add_rows(engine, 7, status="done", age=timedelta(days=6), now=now)
    just_inside = add_rows(engine, 1, status="done", age=timedelta(days=7) - timedelta(seconds=1), now=now)

    deleted = delete_delivered_rows(engine, SampleEvent, older_than=now - timedelta(days=7))

    assert deleted == len(old_done)
    assert remaining(engine) == set(old_pending + old_stuck + recent_done + just_inside)


def test_rows_are_deleted_in_batches_and_a_run_stops_at_its_total(engine, clock):
    now = clock.now()
    old_done = add_rows(engine, 1050, status="done", age=timedelta(days=30), now=now)
    cutoff = now - timedelta(days=7)

    first = delete_delivered_rows(engine, SampleEvent, older_than=cutoff, limits=RetentionLimits(batch_size=100, max_rows=250))

    assert first == 250
    assert remaining(engine) == set(old_done[250:])  # oldest first, in id order
    rest = delete_delivered_rows(engine, SampleEvent, older_than=cutoff, limits=RetentionLimits(batch_size=100))
    assert rest == 800
    assert remaining(engine) == set()


def test_each_batch_commits_on_its_own(engine, clock):
    now = clock.now()
    ids = add_rows(engine, 500, status="done", age=timedelta(days=30), now=now)
    locked = ids[250]  # in the third window of 100
    with engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM sample_event_outbox WHERE id = :id FOR UPDATE"), {"id": locked})
        with run_in_thread(
            lambda: delete_delivered_rows(
                engine, SampleEvent, older_than=now - timedelta(days=7), limits=RetentionLimits(batch_size=100)
            )
        ) as result:
            wait_until_a_delete_waits_for_a_lock(engine)
            # The run is stuck in its third statement; the first two have committed.
            assert remaining(engine) == set(ids[200:])
            holder.rollback()
    assert result == [500]
    assert remaining(engine) == set()


def test_the_walk_stops_at_the_first_window_created_after_the_cutoff(engine, clock):
    now = clock.now()
    old = add_rows(engine, 10, status="done", age=timedelta(days=30), now=now)
    young = add_rows(engine, 10, status="done", age=timedelta(hours=1), now=now)
    # Old rows with higher ids (a backfill with explicit timestamps): past the
    # young window, so this run does not reach them.
    late_old = add_rows(engine, 10, status="done", age=timedelta(days=30), now=now)

    deleted = delete_delivered_rows(engine, SampleEvent, older_than=now - timedelta(days=7), limits=RetentionLimits(batch_size=5))

    assert deleted == len(old)
    assert remaining(engine) == set(young + late_old)


def test_a_row_that_leaves_done_while_the_delete_waits_for_its_lock_is_kept(engine, clock):
    now = clock.now()
    (moved,) = add_rows(engine, 1, status="done", age=timedelta(days=30), now=now)
    others = add_rows(engine, 3, status="done", age=timedelta(days=30), now=now)
    with engine.connect() as holder:
        holder.execute(text("UPDATE sample_event_outbox SET status = 'pending' WHERE id = :id"), {"id": moved})
        with run_in_thread(lambda: delete_delivered_rows(engine, SampleEvent, older_than=now - timedelta(days=7))) as result:
            wait_until_a_delete_waits_for_a_lock(engine)
            holder.commit()  # the DELETE now re-checks the row: pending, so it stays
    assert result == [len(others)]
    assert remaining(engine) == {moved}


@contextmanager
def run_in_thread(function: Callable[[], int]) -> Iterator[list[int]]:
    """Run ``function`` in a thread; on exit wait for it and leave its result in the yielded list."""
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(function()))
    worker.start()
    try:
        yield result
    finally:
        worker.join(timeout=60)
    assert not worker.is_alive()


def wait_until_a_delete_waits_for_a_lock(engine: Engine, timeout: float = 30.0) -> None:
    wait_for_a_lock_wait(engine, statement="DELETE FROM", timeout=timeout)


# -- the scheduled job -----------------------------------------------------------


def test_the_job_is_registered_hourly_with_a_stable_id_and_name(kit):
    job = kit.scheduler.job("outboxkit.retention.sample-events")
    assert retention_job_id(SampleEvent) == "outboxkit.retention.sample-events"
    assert job.name == "sample-events-retention"
    assert job.trigger.interval == timedelta(hours=1)
    listed = {info.id: info.name for info in kit.scheduler.jobs()}
    assert listed["outboxkit.retention.sample-events"] == "sample-events-retention"


def test_without_retention_no_job_is_registered(engine, clock):
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(), clock=clock)
    try:
        assert [info.id for info in kit.scheduler.jobs()] == ["outboxkit.drain.sample-events"]
    finally:
        kit.close()


def test_the_override_off_turns_retention_off(engine, clock):
    kit = kit_with_retention(engine, clock, "off")
    try:
        assert kit.options(SampleEvent).retain_done_for is None
        assert "outboxkit.retention.sample-events" not in {info.id for info in kit.scheduler.jobs()}
    finally:
        kit.close()


def test_a_run_deletes_old_done_rows_and_records_the_count(kit, engine, clock):
    now = clock.now()
    add_rows(engine, 12, status="done", age=timedelta(days=8), now=now)
    kept = add_rows(engine, 3, status="done", age=timedelta(days=1), now=now)
    kept += add_rows(engine, 2, status="stuck", age=timedelta(days=30), now=now)
    scheduled_for = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)

    record = kit.scheduler.run_job("outboxkit.retention.sample-events", scheduled_for=scheduled_for)

    assert (record.outcome, record.counts) == ("ok", {"deleted": 12, "destination_states_pruned": 0})
    assert remaining(engine) == set(kept)
    with engine.connect() as connection:
        run = connection.execute(
            text("SELECT job_name, outcome, counts FROM outboxkit_job_runs WHERE job_id = 'outboxkit.retention.sample-events'")
        ).one()
    assert tuple(run) == ("sample-events-retention", "ok", {"deleted": 12, "destination_states_pruned": 0})


def test_the_cutoff_follows_the_kits_clock(kit, engine, clock):
    now = clock.now()
    ids = add_rows(engine, 4, status="done", age=timedelta(days=6), now=now)
    assert kit.scheduler.run_job("outboxkit.retention.sample-events", scheduled_for=now).counts["deleted"] == 0
    clock.advance(days=2)
    assert kit.scheduler.run_job("outboxkit.retention.sample-events", scheduled_for=clock.now()).counts["deleted"] == 4
    assert remaining(engine).isdisjoint(ids)


def test_a_run_prunes_destination_states_left_quiet_for_the_period(kit, engine, clock):
    """A healthy state without a failure run or a slow-down says nothing an absent one does not: untouched for the
    retention period, it is deleted; one that is open, failing or slowed is kept whatever its age."""
    now = clock.now()
    old, recent = now - timedelta(days=8), now - timedelta(days=1)
    states = [
        ("http://quiet-old:80", "healthy", 0, None, old),
        ("http://quiet-recent:80", "healthy", 0, None, recent),
        ("http://open-old:80", "open", 5, None, old),
        ("http://failing-old:80", "healthy", 2, None, old),
        ("http://slowed-old:80", "healthy", 0, now + timedelta(hours=1), old),
        ("http://slowed-passed-old:80", "healthy", 0, old, old),
    ]
    with engine.begin() as connection:
        for name, status, failures, slowed_until, updated_at in states:
            connection.execute(text(
                "INSERT INTO outboxkit_destinations (outbox, destination, status, consecutive_failures, slowed_until, "
                "updated_at) VALUES ('sample-events', :name, :status, :failures, :slowed_until, :updated_at)"
            ), {"name": name, "status": status, "failures": failures, "slowed_until": slowed_until, "updated_at": updated_at})

    record = kit.scheduler.run_job("outboxkit.retention.sample-events", scheduled_for=now)

    assert record.counts["destination_states_pruned"] == 2
    with engine.connect() as connection:
        kept = set(connection.execute(text("SELECT destination FROM outboxkit_destinations")).scalars())
    assert kept == {"http://quiet-recent:80", "http://open-old:80", "http://failing-old:80", "http://slowed-old:80"}


# -- bad values ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["10", "-1", "0"])
def test_a_bad_override_from_the_environment_names_its_variable(engine, monkeypatch, value):
    monkeypatch.setenv("OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS__RETAIN_DONE_FOR", value)
    settings = OutboxKitSettings.from_environment()
    with pytest.raises(
        ConfigurationError, match=r"OUTBOXKIT_OUTBOXES__SAMPLE_EVENTS: outbox 'sample-events': retain_done_for must be None"
    ):
        OutboxKit(engine, [SampleEvent], settings=settings)
