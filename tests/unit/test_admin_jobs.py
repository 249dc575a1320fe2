"""The jobs page's schedules in words, with their timezone.

Run history and failure counts are in tests/integration/test_admin_jobs.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from outboxkit.operations.trigger_words import describe_trigger
from outboxkit.schedules.jobs import calendar_interval, cron, every, once
from tests.support.admin import (  # noqa: F401  (fixtures)
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    empty_tables,
    record_run,
)


@pytest.mark.parametrize(
    ("trigger", "words"),
    [
        (every(seconds=5), "every 5 seconds (UTC)"),
        (every(minutes=1), "every minute (UTC)"),
        (every(hours=2, minutes=30), "every 2 hours 30 minutes (UTC)"),
        (cron(timezone="Europe/Berlin", hour=2, minute=0), "every day at 02:00 (Europe/Berlin)"),
        (
            cron(timezone="America/New_York", day_of_week="mon-fri", hour=6, minute=30),
            "every mon-fri at 06:30 (America/New_York)",
        ),
        (cron(timezone="UTC", minute="*/5"), "every 5 minutes (UTC)"),
        (cron(timezone="UTC", minute=15), "every hour at minute 15 (UTC)"),
        (
            calendar_interval(timezone="Europe/Berlin", months=1, hour=6),
            "every month at 06:00 (Europe/Berlin), counted from 2000-01-01",
        ),
        (once(datetime(2030, 1, 1, 9, 30, tzinfo=timezone.utc)), "once, at 2030-01-01 09:30:00 (UTC)"),
        ("interval[0:00:05]", "every 5 seconds (timezone not given by the job source)"),
        ("cron[hour='2', minute='0']", "every day at 02:00 (timezone not given by the job source)"),
        ("something else", "something else"),
    ],
)
def test_triggers_are_written_for_people_with_their_timezone(trigger, words):
    assert describe_trigger(trigger) == words
