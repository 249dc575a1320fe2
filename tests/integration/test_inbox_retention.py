"""Inbox retention: records older than the window are pruned, never one inside it; the leader's hourly job."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import INBOX_RETENTION_JOB_ID, inbox_summaries, prune_inbox, record_message
from tests.support.inbox import records
from tests.support.models import SampleEvent


def add_records(engine, count: int, *, received_at: datetime, prefix: str) -> set[tuple[str, str]]:
    added = set()
    with Session(engine) as session, session.begin():
        for number in range(count):
            message_id = f"{prefix}-{number}"
            assert record_message(session, source="billing", message_id=message_id)
            added.add(("billing", message_id))
        session.execute(
            text("UPDATE outboxkit_inbox SET received_at = :at WHERE message_id LIKE :prefix"),
            {"at": received_at, "prefix": f"{prefix}-%"},
        )
    return added


def test_prune_deletes_records_before_the_cutoff_and_none_after(engine):
    now = datetime.now(timezone.utc)
    add_records(engine, 25, received_at=now - timedelta(days=8), prefix="old")
    kept = add_records(engine, 5, received_at=now - timedelta(days=6, hours=23), prefix="young")
    with Session(engine) as session, session.begin():  # a duplicate's count outlives the records
        record_message(session, source="billing", message_id="young-0")

    assert prune_inbox(engine, older_than=now - timedelta(days=7), batch_size=10) == 25
    assert records(engine) == kept
    assert prune_inbox(engine, older_than=now - timedelta(days=7)) == 0
    with engine.connect() as connection:
        [summary] = inbox_summaries(connection)
    assert (summary.received, summary.duplicates) == (5, 1)


def test_a_run_stops_at_its_row_limit_and_the_next_run_finishes(engine):
    now = datetime.now(timezone.utc)
    add_records(engine, 12, received_at=now - timedelta(days=30), prefix="old")
    assert prune_inbox(engine, older_than=now, batch_size=5, max_rows=7) == 7
    assert prune_inbox(engine, older_than=now, batch_size=5) == 5
    assert records(engine) == set()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"older_than": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"older_than": datetime(2030, 1, 1, tzinfo=timezone.utc), "batch_size": 0}, "batch_size"),
        ({"older_than": datetime(2030, 1, 1, tzinfo=timezone.utc), "max_rows": True}, "max_rows"),
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_deleted(engine, arguments, message):
    kept = add_records(engine, 3, received_at=datetime(2020, 1, 1, tzinfo=timezone.utc), prefix="old")
    with pytest.raises(ConfigurationError, match=message):
        prune_inbox(engine, **arguments)
    assert records(engine) == kept


def test_the_leader_runs_the_job_hourly_with_the_window_of_the_setting(engine, clock):
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(inbox_retention_days=7), clock=clock)
    try:
        job = kit.scheduler.job(INBOX_RETENTION_JOB_ID)
        assert (job.name, job.trigger.interval) == ("inbox-retention", timedelta(hours=1))
        now = clock.now()
        old = add_records(engine, 4, received_at=now - timedelta(days=6), prefix="old")
        assert kit.scheduler.run_job(INBOX_RETENTION_JOB_ID, scheduled_for=now).counts == {"deleted": 0}
        clock.advance(days=2)
        record = kit.scheduler.run_job(INBOX_RETENTION_JOB_ID, scheduled_for=clock.now())
        assert (record.outcome, record.counts) == ("ok", {"deleted": 4})
        assert records(engine).isdisjoint(old)
    finally:
        kit.close()


def test_without_the_setting_the_inbox_is_not_pruned(engine, clock):
    kit = OutboxKit(engine, [SampleEvent], settings=OutboxKitSettings(), clock=clock)
    try:
        assert INBOX_RETENTION_JOB_ID not in {info.id for info in kit.scheduler.jobs()}
    finally:
        kit.close()


@pytest.mark.parametrize("days", [0, -1, 0.01, float("inf")])
def test_a_window_under_an_hour_or_not_finite_is_refused_at_start_up(days):
    with pytest.raises(ValueError, match="inbox_retention_days"):
        OutboxKitSettings(inbox_retention_days=days)
