"""Triggers: when a job fires, counted from something every process agrees on.

The run-history fence (``outboxkit.schedules.jobs``) keys on ``(job_id,
scheduled_for)``, so every process must compute the same fire times for the
same job.  Each trigger here does:

* ``cron(timezone=..., **fields)``: wall-clock fields in an IANA timezone;
* ``every(minutes=5)``: elapsed time, counted from ``INTERVAL_ANCHOR``;
* ``calendar_interval(timezone=..., months=1, hour=6)``: calendar steps at a
  wall-clock time, counted from a fixed date;
* ``once(at)``: one aware instant.

What each does when the clocks change (a skipped wall time, a repeated one)
is described in docs/schedules.md ("Triggers and daylight saving") and
pinned by tests/unit/test_jobs_triggers.py.
``outboxkit.schedules.jobs`` re-exports the four builders; import them from either.

Every builder refuses (``ConfigurationError``) a timezone whose rules depend
on the host (``iana_zone``) and a step longer than 100 years
(``MAX_INTERVAL``): past that, fire times leave the calendar a datetime holds.
"""

from __future__ import annotations

import re
import typing
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from outboxkit.errors import ConfigurationError

__all__ = [
    "INTERVAL_ANCHOR",
    "MAX_CALENDAR_DAYS",
    "MAX_CALENDAR_MONTHS",
    "MAX_INTERVAL",
    "AnchoredCalendarTrigger",
    "WallClockCronTrigger",
    "calendar_interval",
    "cron",
    "cron_field_problem",
    "every",
    "iana_zone",
    "once",
]

# The longest step a trigger may take: 100 years.  Longer ones reach past year 9999, the end of the calendar
# the arithmetic can count in, within a few steps of the anchor (or at once).
MAX_INTERVAL = timedelta(days=36_525)
MAX_CALENDAR_MONTHS = 1200
MAX_CALENDAR_DAYS = 36_525
# Directories of the system's zone files that hold copies of the IANA zones with other rules (POSIX
# fallbacks, leap seconds counted into the time): the same name without the prefix is the zone to use.
_ZONE_COPIES = ("posix/", "right/")


def iana_zone(name: str) -> ZoneInfo:
    """The zone named ``name``: an IANA ``Area/Location`` name (``Europe/Berlin``, ``Etc/GMT+5``) or ``UTC``.

    Every process must compute the same fire times, so a name whose rules
    depend on the host is refused: ``localtime`` (the host's own zone),
    the legacy one-word zones (``EST5EDT``, ``CET``, ``Japan``...) and the
    ``posix/`` and ``right/`` copies.  Raises ``ConfigurationError`` saying so.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"a timezone is an IANA name such as 'Europe/Berlin' or 'UTC', not {name!r}")
    if name != "UTC" and ("/" not in name or name.startswith(_ZONE_COPIES)):
        why = (
            "it is this host's own zone, which differs from host to host" if name == "localtime"
            else "a host-dependent copy of a zone" if name.startswith(_ZONE_COPIES)
            else "a legacy zone name"
        )
        raise ConfigurationError(
            f"{name[:64]!r} is not an IANA Area/Location timezone name ({why}); "
            "name the zone, e.g. 'America/New_York', 'Europe/Berlin' or 'UTC'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigurationError(f"unknown IANA timezone {name[:64]!r} (e.g. 'Europe/Berlin', 'UTC')") from None



def _second_pass(moment: datetime) -> bool:
    """Whether ``moment`` is the repeated occurrence of an ambiguous local time (fold=1)."""
    return moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset()


def _end_of_second_pass(moment: datetime) -> datetime:
    """The first instant (UTC) after the repeated wall-clock period that ``moment`` lies in.

    The repeated period is as long as the offset change, and ``moment`` is in
    it, so its end lies within that length after ``moment``; bisect on whole
    seconds (zone transitions fall on whole seconds) for the exact instant.
    """
    zone = moment.tzinfo
    change = moment.replace(fold=0).utcoffset() - moment.utcoffset()  # type: ignore[operator]
    inside = int(moment.timestamp())
    outside = inside + int(change.total_seconds())
    while outside - inside > 1:
        middle = (inside + outside) // 2
        if _second_pass(datetime.fromtimestamp(middle, zone)):
            inside = middle
        else:
            outside = middle
    return datetime.fromtimestamp(outside, timezone.utc)


class WallClockCronTrigger(CronTrigger):
    """APScheduler's ``CronTrigger``, corrected for the repeated hour of fall-back.

    Two corrections, both about the hour that happens twice when clocks go
    back:

    * A job that names its hour (``hour=2``) means that hour of the day
      once, so every fire time in the second pass is skipped: the search
      resumes at the end of the repeated period, however many fire times the
      period holds.  A job whose hour is ``*`` (e.g. every 30 minutes) runs
      in both passes: elapsed time goes on.
    * APScheduler 3.11 steps from the previous fire time by adding 1 µs and
      rounding up on the local clock, and that arithmetic drops ``fold``:
      after a fire time in the second pass it answers one in the first pass,
      *before* the previous one, which a scheduler runs at once, and so on
      in a loop.  Here every search starts from a whole second in UTC, where
      there is no fold (cron fire times fall on whole seconds).
    """

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        candidate: datetime | None
        if previous_fire_time is None:
            candidate = super().get_next_fire_time(None, now.astimezone(timezone.utc))
        else:
            after = previous_fire_time.astimezone(timezone.utc).replace(microsecond=0) + timedelta(seconds=1)
            candidate = typing.cast("datetime | None", super().get_next_fire_time(None, after))
        if str(self.fields[self.FIELD_NAMES.index("hour")]) == "*":
            return candidate
        # Each pass of the loop moves past one whole repeated period, so it ends.
        while candidate is not None and _second_pass(candidate):
            candidate = typing.cast("datetime | None", super().get_next_fire_time(None, _end_of_second_pass(candidate)))
        return candidate


def cron(*, timezone: str, **fields: int | str) -> CronTrigger:
    """A cron schedule in an IANA timezone: ``cron(timezone="Europe/Berlin", hour=3, minute=30)``.

    Fields are APScheduler's: year, month, day, week, day_of_week, hour,
    minute, second.  Daylight saving (docs/schedules.md): in the skipped
    hour of spring-forward the first matching time fires once, shifted by
    the gap (02:30 becomes 03:30), and later ones that day do not fire; in the
    repeated hour of fall-back a job fires in the first pass only, unless its
    hour is ``*``.
    """
    try:
        return WallClockCronTrigger(timezone=iana_zone(timezone), **fields)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"bad cron schedule {fields!r}: {exc}") from None


def cron_field_problem(name: str, value: int | str, *, timezone: str = "UTC") -> str | None:
    """What is wrong with one cron field, in one sentence (``'61' is not a valid minute: the highest value is 59``);
    None when it is valid.  APScheduler's own words are kept only where no plainer ones are known."""
    try:
        WallClockCronTrigger(timezone=iana_zone(timezone), **{name: value})
    except (TypeError, ValueError) as exc:
        reason = _plain_cron_reason(str(exc))
        return f"{value!r} is not a valid {name}" + (f": {reason}" if reason else "")
    return None


_CRON_REASONS = (
    (re.compile(r"the last value \(\d+\) is higher than the maximum value \((\d+)\)"), "the highest value is {0}"),
    (re.compile(r"the first value \(\d+\) is lower than the minimum value \((\d+)\)"), "the lowest value is {0}"),
    (re.compile(r"Increment must be higher than 0"), "the step must be higher than 0"),
    (re.compile(r'Invalid weekday name "([^"]*)"'), "no weekday is named {0}"),
    (re.compile(r'Invalid month name "([^"]*)"'), "no month is named {0}"),
    (re.compile(r"Unrecognized expression"), ""),
)


def _plain_cron_reason(message: str) -> str:
    for pattern, words in _CRON_REASONS:
        found = pattern.search(message)
        if found:
            return words.format(*found.groups())
    return re.sub(r"^Error validating expression '[^']*': ", "", message)


# Interval fire times are counted from this instant unless a job names its own
# start, so every process computes the same fire times for the same job: the
# fence (job_id, scheduled_for) can only stop a second run of an occurrence
# that both schedulers agree on.  calendar_interval() counts from its date.
INTERVAL_ANCHOR = datetime(2000, 1, 1, tzinfo=timezone.utc)


def every(*, seconds: float = 0, minutes: float = 0, hours: float = 0, start: datetime | None = None) -> IntervalTrigger:
    """A fixed interval of elapsed time, e.g. ``every(minutes=5)``.

    Fire times are ``start + k * interval``; ``start`` defaults to
    ``INTERVAL_ANCHOR`` so that every process agrees on them.  Elapsed time
    knows no daylight saving: ``every(hours=24)`` keeps its UTC time and moves
    by an hour on the local clock when the clocks change.
    """
    try:
        period = timedelta(seconds=seconds, minutes=minutes, hours=hours)
    except OverflowError:
        period = MAX_INTERVAL * 2
    if period <= timedelta(0):
        raise ConfigurationError("every() needs a positive interval, e.g. every(minutes=5)")
    if period > MAX_INTERVAL:
        raise ConfigurationError(f"every() takes an interval of at most 100 years ({MAX_INTERVAL.days} days)")
    return IntervalTrigger(seconds=period.total_seconds(), start_date=start or INTERVAL_ANCHOR, timezone=timezone.utc)


class AnchoredCalendarTrigger(BaseTrigger):
    """Every N calendar days, weeks, months or years at one wall-clock time, counted from a fixed date.

    Occurrence ``k`` falls on ``start + k * interval`` (a month step keeps the
    day of the month; a date that does not exist, such as 31 April, has no
    occurrence) at ``time`` in ``timezone``.  Counting from a fixed date, not
    from the day a process booted, is what lets every leader compute the same
    occurrences, so the fence recognises one already run by another leader.

    Without a previous fire time (a scheduler that just started) the first
    occurrence at or after ``now`` is returned, never a past one; after a
    fire time, the next occurrence after it.  A wall time that does not exist
    (spring-forward) fires shifted by the gap; one that happens twice
    (fall-back) fires in the first pass.
    """

    def __init__(
        self, *, months: int, days: int, start: date, at: time, timezone: ZoneInfo
    ) -> None:
        self.months = months  # years are counted as 12 months
        self.days = days  # weeks are counted as 7 days
        self.start = start
        self.at = at
        self.timezone = timezone

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        # In UTC: Python compares two datetimes of one zone by wall time, blind to the fold.
        after = (previous_fire_time or now - timedelta(microseconds=1)).astimezone(timezone.utc)
        index = self._index_before(after.astimezone(self.timezone).date())
        # Ends: the start's own month recurs at least every 12 steps (every 8 years for 29 Feb), and an
        # occurrence past the calendar's last year means there is no next one.
        while not self._past_the_calendar(index):
            fire_time = self._occurrence(index)
            if fire_time is not None and fire_time.astimezone(timezone.utc) > after:
                return fire_time
            index += 1
        return None

    def _past_the_calendar(self, index: int) -> bool:
        """Whether occurrence ``index`` would fall after the last day a date can hold (9999-12-31), or the day before
        (its wall time may lie in the next UTC day)."""
        if self.days:
            return (date.max - self.start).days - 1 < index * self.days
        return self.start.year + (self.start.month - 1 + index * self.months) // 12 >= date.max.year

    def _index_before(self, day: date) -> int:
        """An occurrence index at least one step before ``day``, so none after it is passed over."""
        if self.days:
            steps = (day - self.start).days // self.days
        else:
            steps = ((day.year - self.start.year) * 12 + day.month - self.start.month) // self.months
        return max(0, steps - 1)

    def _occurrence(self, index: int) -> datetime | None:
        if self.days:
            day = self.start + timedelta(days=index * self.days)
        else:
            year, month = divmod(self.start.month - 1 + index * self.months, 12)
            try:
                day = date(self.start.year + year, month + 1, self.start.day)
            except ValueError:  # 31 April, 29 February in a common year
                return None
        # fold=0: a wall time in a gap maps with the offset before it (shifted
        # forward by the gap), a repeated one to its first pass.
        local = datetime.combine(day, self.at, tzinfo=self.timezone)
        return local.astimezone(timezone.utc).astimezone(self.timezone)

    def __str__(self) -> str:
        interval = f"{self.days} day(s)" if self.days else f"{self.months} month(s)"
        return f"calendar_interval[every {interval} at {self.at.isoformat()} {self.timezone.key}, from {self.start}]"

    def __repr__(self) -> str:
        return (
            f"AnchoredCalendarTrigger(months={self.months}, days={self.days}, start={self.start!r}, "
            f"at={self.at!r}, timezone={self.timezone.key!r})"
        )


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
    start: date | datetime | None = None,
) -> AnchoredCalendarTrigger:
    """Every N calendar days/weeks/months/years at one wall-clock time, e.g. monthly at 06:00 Berlin time.

    Occurrences are counted from ``start`` (a date, or an aware datetime
    whose date in ``timezone`` is taken), by default ``INTERVAL_ANCHOR``'s
    date, 2000-01-01: so ``months=1`` runs on the 1st of every month and
    ``weeks=1`` on Saturdays (pass a ``start`` on another weekday, or use
    ``cron(day_of_week=...)``).  ``start`` must be the same in every process:
    a literal date, never ``date.today()``.  Give either years/months or
    weeks/days: a mixed step has no fixed grid.
    """
    zone = iana_zone(timezone)
    counts = {"years": years, "months": months, "weeks": weeks, "days": days}
    if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in counts.values()):
        raise ConfigurationError(f"bad calendar interval {counts!r}: years, months, weeks and days are whole numbers >= 0")
    total_months, total_days = years * 12 + months, weeks * 7 + days
    if total_months > MAX_CALENDAR_MONTHS or total_days > MAX_CALENDAR_DAYS:
        raise ConfigurationError(
            f"bad calendar interval {counts!r}: a step is at most 100 years "
            f"({MAX_CALENDAR_MONTHS} months or {MAX_CALENDAR_DAYS} days)"
        )
    if bool(total_months) == bool(total_days):
        raise ConfigurationError(
            f"bad calendar interval {counts!r}: give years/months or weeks/days (not both, not none), "
            "e.g. calendar_interval(timezone='UTC', months=1, hour=6)"
        )
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise ConfigurationError("calendar_interval(start=...) needs a date or an aware datetime")
        start = start.astimezone(zone).date()
    elif start is not None and not isinstance(start, date):
        raise ConfigurationError(f"calendar_interval(start=...) needs a date, not {start!r}")
    try:
        at = time(hour, minute, second)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"bad calendar interval time: {exc}") from None
    return AnchoredCalendarTrigger(
        months=total_months, days=total_days, start=start or INTERVAL_ANCHOR.date(), at=at, timezone=zone
    )


def once(at: datetime) -> DateTrigger:
    """A one-shot job at an aware instant.  If no leader runs at that instant, the next leader runs it late.

    The instant is absolute, so daylight saving does not move it; a local
    wall time in a gap or a repeated hour is resolved by its ``fold`` as
    Python does (``fold=0``: the offset before the change).
    """
    if not isinstance(at, datetime) or at.tzinfo is None:
        raise ConfigurationError("once() needs an aware datetime, e.g. datetime(2030, 1, 1, tzinfo=timezone.utc)")
    return DateTrigger(run_date=at)
