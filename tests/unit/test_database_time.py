"""``outboxkit.storage.database_time``: how statements read the server's time, and the Clock that Python decides by."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from time import monotonic

import pytest

from outboxkit.clock import ManualClock, SystemClock
from outboxkit.storage import database_time
from outboxkit.storage.database_time import LEASE_UNTIL, NOW, DatabaseTime, database_time_sql
from tests.support.clocks import OffsetClock

NOON = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def test_statements_name_now_and_lease_until_and_get_the_servers_time():
    sql = "WHERE next_attempt_at <= :now AND x::now IS NULL AND :now_later > 0 SET claimed_until = :lease_until"
    assert database_time_sql(sql) == (
        f"WHERE next_attempt_at <= {NOW} AND x::now IS NULL AND :now_later > 0 SET claimed_until = {LEASE_UNTIL}"
    )
    assert NOW == "COALESCE(CAST(:now AS timestamptz), now())"


@pytest.mark.parametrize("clock", [SystemClock(), OffsetClock(timedelta(minutes=10)), None], ids=["system", "offset", "default"])
def test_only_a_manual_clock_overrides_the_servers_time(clock):
    time = DatabaseTime(clock)
    assert not time.overridden and time.parameter() is None


def test_a_manual_clock_is_the_time_everywhere():
    manual = ManualClock(NOON)
    time = DatabaseTime(manual)
    assert time.overridden and time.parameter() == NOON and time.now() == NOON
    time.observe(NOON + timedelta(hours=1), sent_at=0.0)  # a reading changes nothing: the test's time rules
    assert time.now() == NOON
    assert DatabaseTime(time).clock is manual  # wrapping a DatabaseTime wraps its clock


def test_between_readings_the_servers_time_moves_with_the_monotonic_clock(monkeypatch):
    monkeypatch.setattr(database_time.time, "monotonic", lambda: 107.5)
    time = DatabaseTime(OffsetClock(timedelta(hours=3)))  # the host's clock, three hours off, is not consulted
    time.observe(NOON, sent_at=100.0)
    assert time.now() == NOON + timedelta(seconds=7.5)


def test_a_reading_counts_from_when_its_statement_was_sent_so_the_estimate_is_never_behind():
    """A retry's due time (a backoff, a Retry-After) is decided from this estimate: behind, it would come early."""
    server_time = DatabaseTime()
    took = 0.5  # the statement's round trip: the server read its time somewhere inside it
    reading = datetime(2030, 1, 1, tzinfo=timezone.utc)
    server_time.observe(reading, sent_at=monotonic() - took)
    assert server_time.now() - reading >= timedelta(seconds=took)
