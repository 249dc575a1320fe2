"""The scheduler's rules that need no database: schedule validation, interval fire times, no private APScheduler overrides.

Drain jobs, the fence and the job discipline are in tests/integration/test_scheduler.py.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

from outboxkit import ConfigurationError
from outboxkit.leader import scheduler as scheduler_module
from outboxkit.schedules.jobs import cron, every, once

UTC = timezone.utc


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: cron(timezone="Mars/Olympus", hour=3), "unknown IANA timezone"),
        (lambda: cron(timezone="UTC", hour=25), "bad cron schedule"),
        (lambda: every(seconds=0), "positive interval"),
        (lambda: once(datetime(2030, 1, 1)), "aware datetime"),
    ],
)
def test_bad_schedules_are_refused_with_a_clear_message(build, message):
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_interval_jobs_registered_at_different_moments_agree_on_fire_times():
    # The fence dedups a fire time, so two schedulers must compute the same ones.
    from outboxkit.schedules.jobs import every

    now = datetime(2030, 5, 17, 10, 0, 3, 250_000, tzinfo=timezone.utc)
    first, second = every(seconds=7), every(seconds=7)
    assert first.get_next_fire_time(None, now) == second.get_next_fire_time(None, now + timedelta(seconds=2))
    assert every(seconds=7, start=now).get_next_fire_time(None, now) == now


def test_the_scheduler_overrides_no_private_apscheduler_method():
    from apscheduler.executors.base import BaseExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    from outboxkit.leader.scheduler import _OccurrenceScheduler

    own = {name for name, value in vars(_OccurrenceScheduler).items() if name.startswith("_") and callable(value)}
    assert not {name for name in own if not name.startswith("__") and hasattr(BackgroundScheduler, name)}
    assert not any(issubclass(value, BaseExecutor) for value in vars(scheduler_module).values() if isinstance(value, type)
                   and value.__module__ == scheduler_module.__name__)


@pytest.mark.parametrize(("variable", "expected"), [(None, "production"), ("development", "development")])
def test_the_example_service_runs_in_production_unless_told_otherwise(monkeypatch, variable, expected):
    from exampleapp.app import service_settings

    for name in [name for name in os.environ if name.startswith("OUTBOXKIT_")]:
        monkeypatch.delenv(name)
    if variable is not None:
        monkeypatch.setenv("OUTBOXKIT_ENVIRONMENT", variable)
    assert service_settings().environment == expected
