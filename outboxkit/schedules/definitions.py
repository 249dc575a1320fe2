"""Schedules as data: the trigger, the target and the limits of one schedule row.

A schedule is plain data, so it can live in a row (``outboxkit_schedules``),
be edited through an API and be read back by every process; nothing is
pickled.  ``ScheduleDefinition`` holds

* ``trigger``: a ``ScheduleTrigger``, the kind (``cron``, ``every``,
  ``calendar_interval``, ``once``), its fields as JSON values and an IANA
  timezone.  The arithmetic, and what happens when the clocks change, is
  that of ``outboxkit.schedules.triggers`` (pinned by tests/test_jobs_triggers.py);
  this module only builds those triggers from data;
* ``target``: a ``JobTarget`` (a function registered in code under a name)
  or an ``HttpTarget`` (method, URL, headers and JSON body, and the outbox
  that carries the request);
* ``misfire_grace_seconds``, ``max_running`` and ``rerun_if_abandoned``.

Everything is validated when it is built; an ``InvalidScheduleError`` names
the field at fault (``trigger.timezone``, ``trigger.fields.hour``,
``target.url``...).  A ``once`` in the past needs a clock, so it is refused
by ``ScheduleDefinition.check_not_past`` (the store calls it on every
create and edit).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any

from apscheduler.triggers.base import BaseTrigger

from outboxkit.errors import ConfigurationError, InvalidDeliveryError, InvalidScheduleError
from outboxkit.schedules import triggers
from outboxkit.transports.base import Delivery, encode_json

__all__ = ["HttpTarget", "JobTarget", "ScheduleDefinition", "ScheduleTrigger"]

CRON_FIELDS = ("year", "month", "day", "week", "day_of_week", "hour", "minute", "second")
EVERY_FIELDS = ("days", "hours", "minutes", "seconds", "start")
CALENDAR_FIELDS = ("years", "months", "weeks", "days", "hour", "minute", "second", "start")
ONCE_FIELDS = ("at",)
KIND_FIELDS = {"cron": CRON_FIELDS, "every": EVERY_FIELDS, "calendar_interval": CALENDAR_FIELDS, "once": ONCE_FIELDS}
_TIME_LIMITS = {"hour": 23, "minute": 59, "second": 59}
# What each count of a calendar interval may be at most: a step is at most 100 years.
_COUNT_LIMITS = {"years": 100, "months": triggers.MAX_CALENDAR_MONTHS, "weeks": triggers.MAX_CALENDAR_DAYS // 7,
                 "days": triggers.MAX_CALENDAR_DAYS}
# How many of each unit of ``every`` make the longest interval (100 years).
_EVERY_LIMITS = {
    unit: triggers.MAX_INTERVAL // timedelta(**{unit: 1}) for unit in ("days", "hours", "minutes", "seconds")
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
MAX_RUNNING_LIMIT = 1000

JSONValue = int | float | str


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _aware_instant(name: str, value: object) -> datetime:
    """An ISO 8601 string with an offset (or an aware datetime) as an aware UTC datetime."""
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        moment = None
    if moment is None or moment.tzinfo is None:
        raise InvalidScheduleError(
            name, f"needs an ISO 8601 instant with its offset, e.g. '2030-01-01T06:00:00+00:00'; got {value!r}"
        )
    return moment.astimezone(timezone.utc)


@dataclass(frozen=True, kw_only=True)
class ScheduleTrigger:
    """When a schedule fires, as data: ``kind``, its ``fields`` (JSON values) and an IANA ``timezone``.

    Build one with the class methods, which read like ``outboxkit.schedules.triggers``::

        ScheduleTrigger.cron(timezone="Europe/Berlin", hour=3, minute=30)
        ScheduleTrigger.every(minutes=5)
        ScheduleTrigger.calendar_interval(timezone="Europe/Berlin", months=1, hour=6)
        ScheduleTrigger.once(at="2030-01-01T06:00:00+01:00")

    Fire times are aware UTC datetimes, the same in every process.
    """

    kind: str
    fields: Mapping[str, JSONValue] = field(default_factory=dict)
    timezone: str = "UTC"
    _built: BaseTrigger | None = field(init=False, repr=False, compare=False, default=None)
    _at: datetime | None = field(init=False, repr=False, compare=False, default=None)

    @classmethod
    def cron(cls, *, timezone: str = "UTC", **fields: JSONValue) -> ScheduleTrigger:
        return cls(kind="cron", fields=fields, timezone=timezone)

    @classmethod
    def every(cls, **fields: JSONValue) -> ScheduleTrigger:
        return cls(kind="every", fields=fields)

    @classmethod
    def calendar_interval(cls, *, timezone: str = "UTC", **fields: JSONValue) -> ScheduleTrigger:
        return cls(kind="calendar_interval", fields=fields, timezone=timezone)

    @classmethod
    def once(cls, *, at: str | datetime, timezone: str = "UTC") -> ScheduleTrigger:
        instant = at.isoformat() if isinstance(at, datetime) else at
        return cls(kind="once", fields={"at": instant}, timezone=timezone)

    def __post_init__(self) -> None:
        if self.kind not in KIND_FIELDS:
            raise InvalidScheduleError("trigger.kind", f"must be one of {', '.join(KIND_FIELDS)}; got {self.kind!r}")
        if not isinstance(self.fields, Mapping):
            raise InvalidScheduleError("trigger.fields", f"must be a mapping of field name to value; got {self.fields!r}")
        for name in self.fields:
            if name not in KIND_FIELDS[self.kind]:
                raise InvalidScheduleError(
                    f"trigger.fields.{name}", f"is not a field of {self.kind}; expected {', '.join(KIND_FIELDS[self.kind])}"
                )
        try:
            triggers.iana_zone(self.timezone)
        except ConfigurationError as exc:
            raise InvalidScheduleError("trigger.timezone", str(exc)) from None
        object.__setattr__(self, "fields", dict(self.fields))
        if self.kind == "once":
            object.__setattr__(self, "_at", _aware_instant("trigger.fields.at", self.fields.get("at")))
        else:
            object.__setattr__(self, "_built", getattr(self, f"_build_{self.kind}")())

    def _build_cron(self) -> BaseTrigger:
        for name, value in self.fields.items():
            if not (_is_whole(value) or isinstance(value, str)):
                raise InvalidScheduleError(
                    f"trigger.fields.{name}", f"must be a whole number or a cron expression; got {value!r}"
                )
            # One field at a time, so the error names the one at fault, in one sentence.
            problem = triggers.cron_field_problem(name, value, timezone=self.timezone)  # type: ignore[arg-type]
            if problem is not None:
                raise InvalidScheduleError(f"trigger.fields.{name}", problem)
        if not self.fields:
            raise InvalidScheduleError("trigger.fields", "a cron schedule needs at least one field, e.g. {'minute': '*/5'}")
        return triggers.cron(timezone=self.timezone, **self.fields)  # type: ignore[arg-type]  # each field checked

    def _build_every(self) -> BaseTrigger:
        seconds = 0.0
        for name, value in self.fields.items():
            if name == "start":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidScheduleError(f"trigger.fields.{name}", f"must be a number >= 0; got {value!r}")
            if value > _EVERY_LIMITS[name]:
                raise InvalidScheduleError(
                    f"trigger.fields.{name}",
                    f"must be at most {_EVERY_LIMITS[name]:,} (an interval is at most 100 years); got {value!r}",
                )
            seconds += timedelta(**{name: value}).total_seconds()
        if seconds > triggers.MAX_INTERVAL.total_seconds():
            raise InvalidScheduleError("trigger.fields", "the interval must be at most 100 years in all")
        if seconds <= 0:
            named = [name for name in self.fields if name != "start"]
            where = f"trigger.fields.{named[0]}" if len(named) == 1 else "trigger.fields"
            raise InvalidScheduleError(where, "every needs a positive interval, e.g. {'minutes': 5}")
        start = self.fields.get("start")
        anchor = _aware_instant("trigger.fields.start", start) if start is not None else None
        return triggers.every(seconds=seconds, start=anchor)

    def _build_calendar_interval(self) -> BaseTrigger:
        counts: dict[str, int] = {}
        for name, value in self.fields.items():
            if name == "start":
                continue
            limit = _TIME_LIMITS.get(name) or _COUNT_LIMITS[name]
            if not _is_whole(value) or value < 0 or value > limit:  # type: ignore[operator]
                why = "" if name in _TIME_LIMITS else " (a step is at most 100 years)"
                raise InvalidScheduleError(
                    f"trigger.fields.{name}", f"must be a whole number from 0 to {limit}{why}; got {value!r}"
                )
            counts[name] = value  # type: ignore[assignment]
        start: date | None = None
        if "start" in self.fields:
            try:
                start = date.fromisoformat(self.fields["start"])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise InvalidScheduleError(
                    "trigger.fields.start", f"needs an ISO 8601 date, e.g. '2026-03-01'; got {self.fields['start']!r}"
                ) from None
        try:
            return triggers.calendar_interval(timezone=self.timezone, start=start, **counts)
        except ConfigurationError as exc:
            raise InvalidScheduleError("trigger.fields", str(exc)) from None

    def apscheduler_trigger(self) -> BaseTrigger:
        """The same fire times as an APScheduler trigger (the elected scheduler's form, for the deprecated
        ``kit.scheduler.add_job``)."""
        if self._at is not None:
            return triggers.once(self._at)
        assert self._built is not None
        return self._built

    # -- fire times ---------------------------------------------------------

    def first_at_or_after(self, moment: datetime) -> datetime | None:
        """The first fire time at or after ``moment`` (UTC), or None when there is none."""
        if self._at is not None:
            return self._at if self._at >= moment else None
        assert self._built is not None
        try:
            fire_time = self._built.get_next_fire_time(None, moment)
        except OverflowError:  # past year 9999: no fire time a datetime can hold
            return None
        return fire_time.astimezone(timezone.utc) if fire_time is not None else None

    def first_after(self, moment: datetime) -> datetime | None:
        """The first fire time strictly after ``moment`` (UTC), or None."""
        return self.first_at_or_after(moment + timedelta(microseconds=1))

    def next_after(self, fire_time: datetime) -> datetime | None:
        """The fire time that follows ``fire_time`` (itself a fire time), or None."""
        if self._at is not None:
            return self._at if self._at > fire_time else None
        assert self._built is not None
        try:
            following = self._built.get_next_fire_time(fire_time, fire_time)
        except OverflowError:  # past year 9999
            return None
        return following.astimezone(timezone.utc) if following is not None else None

    def latest_at_or_before(self, moment: datetime, *, not_before: datetime) -> datetime | None:
        """The last fire time in ``[not_before, moment]``, or None.

        Triggers only step forward, so this looks back from ``moment`` over a
        window that doubles until it holds a fire time, then steps forward
        through it: a few trigger steps, however long ago ``not_before`` is.
        """
        window = timedelta(seconds=1)
        while True:
            start = max(moment - window, not_before)
            found = self.first_at_or_after(start)
            if found is not None and found <= moment:
                following = self.next_after(found)
                while following is not None and following <= moment:
                    found, following = following, self.next_after(following)
                return found
            if start == not_before:
                return None
            window *= 2

    def upcoming(self, count: int, *, after: datetime) -> list[datetime]:
        """The next ``count`` fire times after ``after`` (fewer if the trigger ends)."""
        found: list[datetime] = []
        fire_time = self.first_after(after)
        while fire_time is not None and len(found) < count:
            found.append(fire_time)
            fire_time = self.next_after(fire_time)
        return found

    def describe(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.fields.items())
        return f"{self.kind}({fields}) in {self.timezone}"


@dataclass(frozen=True, kw_only=True)
class JobTarget:
    """Run the function registered in code under ``job`` (see ``outboxkit.schedules.runner.ScheduleRunner``)."""

    job: str

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not _NAME.fullmatch(self.job):
            raise InvalidScheduleError(
                "target.job", f"must be 1-200 letters, digits, '.', ':', '_' or '-'; got {self.job!r}"
            )


@dataclass(frozen=True, kw_only=True)
class HttpTarget:
    """Send an HTTP request, enqueued into ``outbox`` (the ``job_name`` of a ``ScheduledRequestOutbox``).

    ``body`` is JSON, stored as encoded by ``outboxkit.transports.base`` (an aware
    datetime becomes its ISO string, a Decimal its exact string).
    """

    url: str
    outbox: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None

    def __post_init__(self) -> None:
        steps: list[tuple[str, dict[str, Any]]] = [
            ("target.url", {"url": self.url}),
            ("target.method", {"method": self.method}),
            ("target.headers", {"headers": self.headers}),
        ]
        arguments: dict[str, Any] = {}
        for name, argument in steps:  # one argument at a time, so the error names the one at fault
            arguments.update(argument)
            try:
                delivery = Delivery(**arguments)
            except InvalidDeliveryError as exc:
                raise InvalidScheduleError(name, str(exc)) from None
        try:
            body = None if self.body is None else json.loads(encode_json(self.body))
        except InvalidDeliveryError as exc:
            raise InvalidScheduleError("target.body", str(exc)) from None
        if not isinstance(self.outbox, str) or not self.outbox:
            raise InvalidScheduleError("target.outbox", f"must name an outbox by its job_name; got {self.outbox!r}")
        object.__setattr__(self, "method", delivery.method)
        object.__setattr__(self, "headers", dict(delivery.headers))
        object.__setattr__(self, "body", body)


@dataclass(frozen=True, kw_only=True)
class ScheduleDefinition:
    """One schedule: a unique ``name``, its trigger and target, and how it treats late and running occurrences.

    * ``misfire_grace_seconds``: an occurrence found due at most this late
      runs (once, coalesced with any other late ones); older ones are
      recorded as ``missed``.
    * ``max_running``: how many runs of a Python job may hold a lease at
      once, across every process (1: the job never overlaps itself).
    * ``rerun_if_abandoned``: the job is safe to run again, so a run whose
      process died (its lease expired) is re-run once; otherwise it stays
      ``abandoned``.
    """

    name: str
    trigger: ScheduleTrigger
    target: JobTarget | HttpTarget
    enabled: bool = True
    misfire_grace_seconds: int = 300
    max_running: int = 1
    rerun_if_abandoned: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidScheduleError(
                "name", f"must be 1-200 letters, digits, '.', ':', '_' or '-', e.g. 'billing.nightly'; got {self.name!r}"
            )
        if not isinstance(self.trigger, ScheduleTrigger):
            raise InvalidScheduleError("trigger", f"must be a ScheduleTrigger; got {self.trigger!r}")
        if not isinstance(self.target, (JobTarget, HttpTarget)):
            raise InvalidScheduleError("target", f"must be a JobTarget or an HttpTarget; got {self.target!r}")
        for name in ("enabled", "rerun_if_abandoned"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidScheduleError(name, f"must be true or false; got {getattr(self, name)!r}")
        grace = self.misfire_grace_seconds
        if not _is_whole(grace) or not 0 <= grace <= 366 * 86400:
            raise InvalidScheduleError(
                "misfire_grace_seconds", f"must be a whole number of seconds from 0 to a year; got {grace!r}"
            )
        if not _is_whole(self.max_running) or not 1 <= self.max_running <= MAX_RUNNING_LIMIT:
            raise InvalidScheduleError(
                "max_running", f"must be a whole number from 1 to {MAX_RUNNING_LIMIT}; got {self.max_running!r}"
            )

    @property
    def grace(self) -> timedelta:
        return timedelta(seconds=self.misfire_grace_seconds)

    def check_not_past(self, now: datetime) -> None:
        """Refuse a trigger with no fire time at or after ``now``: a ``once`` in the past, a cron no date matches
        (31 February, a year gone by), an interval whose next step lies past year 9999."""
        if self.trigger.first_at_or_after(now) is not None:
            return
        if self.trigger.kind == "once":
            raise InvalidScheduleError("trigger.fields.at", f"{self.trigger.fields['at']} is in the past (now {now.isoformat()})")
        raise InvalidScheduleError(
            "trigger.fields",
            f"never fires: no fire time at or after {now.isoformat()} up to the year 9999 "
            "(a date that does not exist, such as day 31 of February, or one that has passed)",
        )
