"""What an operator reads about schedules: the next fire times in two timezones, and one schedule's history.

The admin's pages and JSON API and the CLI read through these, as the drain
and the admin share their queries for rows.

* ``next_fire_times``: a schedule's next fire times (five by default), each
  in UTC, in the schedule's own timezone and in the viewer's.  The first is
  ``next_run_at``, which may lie in the past when the schedule is overdue;
  a disabled schedule has none.
* ``schedule_history``: the recorded occurrences of one schedule, newest
  first: its runs (``running``, ``ok``, ``error``), the HTTP calls it
  ``enqueued``, what it ``missed`` and the runs ``abandoned``; filtered by
  outcome and paged by fire time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Engine, select

from outboxkit.errors import InvalidValueError
from outboxkit.schedules.rows import Schedule
from outboxkit.schedules.store import Transactions
from outboxkit.storage.tables import RUN_OUTCOMES, job_runs

__all__ = ["FireTime", "ScheduleRun", "next_fire_times", "schedule_history"]

HISTORY_PAGE_LIMIT = 500


@dataclass(frozen=True, kw_only=True)
class FireTime:
    """One fire time: ``at`` in UTC, ``local`` in the schedule's timezone, ``viewer`` in the viewer's."""

    at: datetime
    local: datetime
    viewer: datetime


@dataclass(frozen=True, kw_only=True)
class ScheduleRun:
    """One recorded occurrence of a schedule."""

    scheduled_for: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    counts: dict[str, Any]
    error: str | None
    holder: str


def _zone(name: str, what: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidValueError(f"{what}: unknown IANA timezone {name!r} (e.g. 'Europe/Berlin', 'UTC')") from None


def next_fire_times(schedule: Schedule, *, count: int = 5, viewer_timezone: str = "UTC") -> list[FireTime]:
    """The schedule's next ``count`` fire times, starting with its ``next_run_at``; none while it is disabled."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100:
        raise InvalidValueError(f"count must be a whole number from 1 to 100, got {count!r}")
    viewer = _zone(viewer_timezone, "viewer_timezone")
    trigger = schedule.definition.trigger
    first = schedule.next_run_at
    if not schedule.definition.enabled or first is None:
        return []
    times = [first, *trigger.upcoming(count - 1, after=first)]
    local = ZoneInfo(trigger.timezone)
    return [
        FireTime(at=at.astimezone(timezone.utc), local=at.astimezone(local), viewer=at.astimezone(viewer)) for at in times
    ]


def schedule_history(
    engine: Engine | Transactions,
    name: str,
    *,
    limit: int = 50,
    outcomes: Collection[str] | None = None,
    before: datetime | None = None,
) -> list[ScheduleRun]:
    """The newest ``limit`` recorded occurrences of ``name`` (fire time before ``before``, of ``outcomes``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HISTORY_PAGE_LIMIT:
        raise InvalidValueError(f"limit must be a whole number from 1 to {HISTORY_PAGE_LIMIT}, got {limit!r}")
    unknown = set(outcomes or ()) - set(RUN_OUTCOMES)
    if unknown:
        raise InvalidValueError(f"unknown outcome(s) {sorted(unknown)}; expected some of {', '.join(RUN_OUTCOMES)}")
    statement = select(job_runs).where(job_runs.c.job_id == name)
    if outcomes:
        statement = statement.where(job_runs.c.outcome.in_(list(outcomes)))
    if before is not None:
        statement = statement.where(job_runs.c.scheduled_for < before)
    statement = statement.order_by(job_runs.c.scheduled_for.desc()).limit(limit)
    with engine.connect() as connection:
        rows = connection.execute(statement).mappings().all()
    return [
        ScheduleRun(
            scheduled_for=row["scheduled_for"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            outcome=row["outcome"],
            counts=row["counts"],
            error=row["error"],
            holder=row["leader"],
        )
        for row in rows
    ]
