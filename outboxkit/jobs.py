"""Scheduled jobs: their definitions, their triggers and the discipline every run follows.

A job is a function of one ``JobContext`` that returns counts (or None)::

    def expire_trials(context: JobContext) -> dict[str, int]:
        expired = context.session.execute(update(Trial)...).rowcount
        context.session.commit()
        return {"expired": expired}

    kit.scheduler.add_job("billing.expire-trials", expire_trials,
                          cron(timezone="Europe/Berlin", hour=3, minute=30))

Every run goes through ``JobRunner.run``, which

* takes the *fence* first: it inserts the occurrence (``job_id``,
  ``scheduled_for``) into ``outboxkit_job_runs`` with ``ON CONFLICT DO
  NOTHING`` and skips the run if the row was already there.  Two schedulers
  that both believe they lead (the short window of a lost lock) therefore
  cannot run one occurrence twice.  The fence is a committed row, not a
  lock: transaction-level advisory locks vanish at commit and guard nothing;
* gives the job a fresh ``Session`` and closes it in ``finally``;
* never lets an exception escape into APScheduler: it is logged with its
  traceback and recorded as the run's ``error``;
* records the run's end, outcome and counts, then trims the job's history to
  the newest ``history_limit`` runs, so the admin can show a heartbeat;
* logs only when something happened (a non-zero count, an error, a skip).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.calendarinterval import CalendarIntervalTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from outboxkit.errors import ConfigurationError
from outboxkit.telemetry import Telemetry, log_fields

__all__ = [
    "JobContext",
    "JobFailed",
    "JobRunner",
    "ScheduledJob",
    "calendar_interval",
    "cron",
    "every",
    "once",
]

logger = logging.getLogger("outboxkit.jobs")

ERROR_TEXT_LIMIT = 4000
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


class JobFailed(Exception):
    """Raise from a job to record an ``error`` outcome with this message and no traceback."""


@dataclass(frozen=True, kw_only=True)
class JobContext:
    """What one run of a job gets: its identity, its fire time and a fresh session."""

    job_id: str
    job_name: str
    scheduled_for: datetime
    session: Session
    leader: str


# A job may be ``async def``: it then runs on a fresh event loop in the worker
# thread, never on the application's loop.
JobFunction = Callable[[JobContext], Mapping[str, int] | None | Awaitable[Mapping[str, int] | None]]


@dataclass(frozen=True, kw_only=True)
class ScheduledJob:
    """A job as registered: stable ``id`` and human ``name`` (monitors key on both), trigger, function.

    ``fenced=False`` is for runs that are not occurrences of a schedule (a
    drain woken by NOTIFY): they take no fence and are recorded after the fact.
    """

    id: str
    name: str
    trigger: BaseTrigger
    function: JobFunction
    fenced: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _JOB_ID.match(self.id):
            raise ConfigurationError(
                f"job id {self.id!r} must be 1-200 characters of letters, digits, '.', ':', '_' or '-' "
                "(e.g. 'billing.expire-trials')"
            )
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise ConfigurationError(f"job {self.id!r}: name must be 1-200 characters, got {self.name!r}")
        if not isinstance(self.trigger, BaseTrigger):
            raise ConfigurationError(
                f"job {self.id!r}: trigger must come from cron(), every(), calendar_interval() or once()"
            )
        if not callable(self.function):
            raise ConfigurationError(f"job {self.id!r}: function must be callable with one JobContext")


# -- triggers ------------------------------------------------------------------


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigurationError(f"unknown IANA timezone {name!r} (e.g. 'Europe/Berlin', 'UTC')") from None


class WallClockCronTrigger(CronTrigger):
    """APScheduler's ``CronTrigger`` that fires a fixed wall-clock time once on the fall-back day.

    When clocks go back, 02:00-03:00 happens twice.  APScheduler fires a
    daily 02:30 job in both passes; a job that names its hour is meant to
    run once a day, so the second pass is skipped.  A job whose hour is
    ``*`` (e.g. every 30 minutes) runs in both passes: elapsed time goes on.
    """

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        hour_is_wildcard = str(self.fields[self.FIELD_NAMES.index("hour")]) == "*"
        candidate = super().get_next_fire_time(previous_fire_time, now)
        for _ in range(8):  # at most a few repeated instants in a row
            if candidate is None or hour_is_wildcard or not _second_pass(candidate):
                return candidate
            # In UTC: wall-clock arithmetic on an aware local time would drop the fold.
            after = candidate.astimezone(timezone.utc)
            candidate = super().get_next_fire_time(after, after + timedelta(seconds=1))
        return candidate


def _second_pass(moment: datetime) -> bool:
    """Whether ``moment`` is the repeated occurrence of an ambiguous local time (fold=1)."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


def cron(*, timezone: str, **fields: int | str) -> CronTrigger:
    """A cron schedule in an IANA timezone: ``cron(timezone="Europe/Berlin", hour=3, minute=30)``.

    Fields are APScheduler's: year, month, day, week, day_of_week, hour,
    minute, second.  Daylight saving: a wall-clock time that does not exist
    (spring-forward) fires shifted by the gap (02:30 becomes 03:30); a time
    that happens twice (fall-back) fires once, in the first pass, unless the
    hour is ``*``.
    """
    try:
        return WallClockCronTrigger(timezone=_zone(timezone), **fields)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"bad cron schedule {fields!r}: {exc}") from None


# Interval fire times are counted from this instant unless a job names its own
# start, so every process computes the same fire times for the same job: the
# fence (job_id, scheduled_for) can only stop a second run of an occurrence
# that both schedulers agree on.
INTERVAL_ANCHOR = datetime(2000, 1, 1, tzinfo=timezone.utc)


def every(*, seconds: float = 0, minutes: float = 0, hours: float = 0, start: datetime | None = None) -> IntervalTrigger:
    """A fixed interval of elapsed time, e.g. ``every(minutes=5)``.

    Fire times are ``start + k * interval``; ``start`` defaults to
    ``INTERVAL_ANCHOR`` so that every process agrees on them.
    """
    period = timedelta(seconds=seconds, minutes=minutes, hours=hours)
    if period <= timedelta(0):
        raise ConfigurationError("every() needs a positive interval, e.g. every(minutes=5)")
    return IntervalTrigger(seconds=period.total_seconds(), start_date=start or INTERVAL_ANCHOR, timezone=timezone.utc)


def calendar_interval(
    *,
    timezone: str,
    years: int = 0,
    months: int = 0,
    weeks: int = 0,
    days: int = 0,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    start: datetime | None = None,
) -> CalendarIntervalTrigger:
    """Every N calendar days/weeks/months/years at one wall-clock time, e.g. monthly at 06:00 Berlin time."""
    try:
        return CalendarIntervalTrigger(
            years=years,
            months=months,
            weeks=weeks,
            days=days,
            hour=hour,
            minute=minute,
            second=second,
            start_date=start.date() if start is not None else None,
            timezone=_zone(timezone),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"bad calendar interval: {exc}") from None


def once(at: datetime) -> DateTrigger:
    """A one-shot job at an aware instant.  If no leader runs at that instant, the next leader runs it late."""
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise ConfigurationError("once() needs an aware datetime, e.g. datetime(2030, 1, 1, tzinfo=timezone.utc)")
    return DateTrigger(run_date=at)


# -- running -----------------------------------------------------------------

_TAKE_FENCE = text(
    """
    INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, leader)
    VALUES (:job_id, :job_name, :scheduled_for, clock_timestamp(), :leader)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id
    """
)
_FINISH = text(
    """
    UPDATE outboxkit_job_runs
    SET finished_at = clock_timestamp(), outcome = :outcome, counts = CAST(:counts AS jsonb), error = :error
    WHERE id = :run_id
    """
)
_RECORD_UNFENCED = text(
    """
    INSERT INTO outboxkit_job_runs
        (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader)
    VALUES (:job_id, :job_name, :scheduled_for, :started_at, clock_timestamp(), :outcome,
            CAST(:counts AS jsonb), :error, :leader)
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    """
)
# Keeps the newest :keep runs of one job (the cut-off is the :keep-th newest); served by (job_id, started_at).
_TRIM = text(
    """
    DELETE FROM outboxkit_job_runs
    WHERE job_id = :job_id AND started_at < (
        SELECT started_at FROM outboxkit_job_runs WHERE job_id = :job_id
        ORDER BY started_at DESC OFFSET :keep - 1 LIMIT 1
    )
    """
)


@dataclass(frozen=True)
class RunRecord:
    """What ``JobRunner.run`` did: ``skipped`` if the fence said the occurrence already ran."""

    outcome: str  # "ok", "error" or "skipped"
    counts: dict[str, int]
    error: str | None = None


class JobRunner:
    """Runs one occurrence of a job under the fence and records it.  ``run`` never raises."""

    def __init__(
        self, engine: Engine, *, leader: Callable[[], str], history_limit: int = 200, telemetry: Telemetry | None = None
    ) -> None:
        self.engine = engine
        self._leader = leader
        self.history_limit = history_limit
        self.telemetry = telemetry if telemetry is not None else Telemetry()  # job-run metrics; no-op unless attached

    def run(self, job: ScheduledJob, *, scheduled_for: datetime) -> RunRecord:
        started = time.monotonic()
        record = self._run(job, scheduled_for=scheduled_for)
        self.telemetry.job_finished(job.id, job.name, record, time.monotonic() - started)
        return record

    def _run(self, job: ScheduledJob, *, scheduled_for: datetime) -> RunRecord:
        leader = self._leader()
        try:
            run_id = None
            if job.fenced:
                with self.engine.begin() as connection:
                    run_id = connection.execute(
                        _TAKE_FENCE,
                        {"job_id": job.id, "job_name": job.name, "scheduled_for": scheduled_for, "leader": leader},
                    ).scalar()
                if run_id is None:
                    logger.warning(
                        "%s: the run scheduled for %s was already taken by another scheduler; skipped",
                        job.name,
                        scheduled_for.isoformat(),
                        extra=log_fields("job.skipped", job=job.id),
                    )
                    return RunRecord(outcome="skipped", counts={})
            started_at = datetime.now(timezone.utc)
            record = self._call(job, scheduled_for=scheduled_for, leader=leader)
            values = {
                "outcome": record.outcome,
                "counts": json.dumps(record.counts),
                "error": record.error,
            }
            with self.engine.begin() as connection:
                if run_id is not None:
                    connection.execute(_FINISH, {**values, "run_id": run_id})
                else:
                    connection.execute(
                        _RECORD_UNFENCED,
                        {
                            **values,
                            "job_id": job.id,
                            "job_name": job.name,
                            "scheduled_for": scheduled_for,
                            "started_at": started_at,
                            "leader": leader,
                        },
                    )
                connection.execute(_TRIM, {"job_id": job.id, "keep": self.history_limit})
            return record
        except Exception as exc:  # the history table is unreachable: the job itself has run or will run again
            logger.error("%s: could not record the run scheduled for %s: %s", job.name, scheduled_for.isoformat(), exc,
                         extra=log_fields("job.record_failed", job=job.id))
            return RunRecord(outcome="error", counts={}, error=f"{type(exc).__name__}: {exc}")

    def _call(self, job: ScheduledJob, *, scheduled_for: datetime, leader: str) -> RunRecord:
        session = Session(self.engine)
        try:
            context = JobContext(
                job_id=job.id, job_name=job.name, scheduled_for=scheduled_for, session=session, leader=leader
            )
            outcome = job.function(context)
            if inspect.isawaitable(outcome):  # an async job gets its own event loop, in this worker thread
                outcome = asyncio.run(_await(outcome))
            counts = _counts(outcome)
        except JobFailed as exc:
            logger.error("%s: %s", job.name, exc, extra=log_fields("job.failed", job=job.id))
            return RunRecord(outcome="error", counts={}, error=str(exc)[:ERROR_TEXT_LIMIT])
        except Exception as exc:
            logger.error("%s: the job raised\n%s", job.name, traceback.format_exc().rstrip(),
                         extra=log_fields("job.failed", job=job.id))
            return RunRecord(outcome="error", counts={}, error=f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT])
        finally:
            session.close()
        if any(counts.values()):
            logger.info("%s: %s", job.name, ", ".join(f"{key} {value}" for key, value in counts.items() if value),
                        extra=log_fields("job.counts", job=job.id, counts=counts))
        return RunRecord(outcome="ok", counts=counts)


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _counts(value: object) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(key, str) and isinstance(count, int) and not isinstance(count, bool) for key, count in value.items()
    ):
        raise TypeError(f"a job returns a mapping of str to int counts (or None), not {value!r}")
    return dict(value)
