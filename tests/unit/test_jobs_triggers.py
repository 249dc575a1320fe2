"""Triggers: the fire times of cron, every, calendar_interval and once, computed, never waited for.

The DST table pins what each trigger does at both boundaries of daylight
saving, in Europe/Berlin and America/New_York (2026), as docs/schedules.md
describes it:

* Berlin: spring forward 29 March 01:00 UTC (02:00 CET becomes 03:00 CEST),
  fall back 25 October 01:00 UTC (03:00 CEST becomes 02:00 CET: 02:00-02:59
  happens twice);
* New York: spring forward 8 March 07:00 UTC (02:00 EST becomes 03:00 EDT),
  fall back 1 November 06:00 UTC (02:00 EDT becomes 01:00 EST: 01:00-01:59
  happens twice).

Expected fire times are written as local wall time with the offset in force,
so ``02:30+02:00`` and ``02:30+01:00`` are the two passes of one wall time.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.date import DateTrigger

from outboxkit import ConfigurationError
from outboxkit.schedules.jobs import calendar_interval, cron, every, once

UTC = timezone.utc
BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")


def fire_times(trigger, since: datetime, count: int) -> list[datetime]:
    """The first ``count`` fire times at or after ``since``, as APScheduler asks for them."""
    now, previous, fired = since, None, []
    while len(fired) < count:
        previous = trigger.get_next_fire_time(previous, now)
        if previous is None:
            break
        fired.append(previous)
        now = previous + timedelta(milliseconds=3)  # a scheduler asks a moment after the run it just started
    return fired


def every_five_minutes(hour: str, day: str) -> list[str]:
    return [f"{day}T{hour}:{minute:02d}" for minute in range(0, 60, 5)]


# (case, trigger, search from (UTC), expected fire times (local wall time with its offset))
DST_TABLE = [
    # -- cron: wall-clock fields ------------------------------------------------
    ("cron Berlin 02:30 in the spring gap fires once, shifted to 03:30 CEST",
     lambda: cron(timezone="Europe/Berlin", hour=2, minute=30), "2026-03-28T00:00",
     ["2026-03-28T02:30+01:00", "2026-03-29T03:30+02:00", "2026-03-30T02:30+02:00"]),
    ("cron Berlin 02:30 in the repeated hour fires in the first pass only",
     lambda: cron(timezone="Europe/Berlin", hour=2, minute=30), "2026-10-24T00:00",
     ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
    ("cron Berlin hour 2 every 5 minutes: all twelve in the first pass, none in the second",
     lambda: cron(timezone="Europe/Berlin", hour=2, minute="*/5"), "2026-10-24T23:00",
     [f"{time}+02:00" for time in every_five_minutes("02", "2026-10-25")] + ["2026-10-26T02:00+01:00"]),
    ("cron Berlin hour 2 every 5 minutes in the spring gap: the first fires at 03:00 CEST, the rest not",
     lambda: cron(timezone="Europe/Berlin", hour=2, minute="*/5"), "2026-03-28T23:00",
     ["2026-03-29T03:00+02:00", "2026-03-30T02:00+02:00", "2026-03-30T02:05+02:00"]),
    ("cron Berlin every 30 minutes keeps elapsed time across the gap",
     lambda: cron(timezone="Europe/Berlin", minute="*/30"), "2026-03-29T00:00",
     ["2026-03-29T01:00+01:00", "2026-03-29T01:30+01:00", "2026-03-29T03:00+02:00", "2026-03-29T03:30+02:00"]),
    ("cron Berlin every 30 minutes runs in both passes of the repeated hour",
     lambda: cron(timezone="Europe/Berlin", minute="*/30"), "2026-10-25T00:00",
     ["2026-10-25T02:00+02:00", "2026-10-25T02:30+02:00", "2026-10-25T02:00+01:00", "2026-10-25T02:30+01:00",
      "2026-10-25T03:00+01:00"]),
    ("cron Berlin daily 09:00 keeps its wall time across both changes",
     lambda: cron(timezone="Europe/Berlin", hour=9, minute=0), "2026-03-28T00:00",
     ["2026-03-28T09:00+01:00", "2026-03-29T09:00+02:00", "2026-03-30T09:00+02:00"]),
    ("cron New York 02:30 in the spring gap fires once, shifted to 03:30 EDT",
     lambda: cron(timezone="America/New_York", hour=2, minute=30), "2026-03-07T12:00",
     ["2026-03-08T03:30-04:00", "2026-03-09T02:30-04:00"]),
    ("cron New York 01:30 in the repeated hour fires in the first pass only",
     lambda: cron(timezone="America/New_York", hour=1, minute=30), "2026-10-31T12:00",
     ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"]),
    ("cron New York hour 1 every 5 minutes: all twelve in the first pass, none in the second",
     lambda: cron(timezone="America/New_York", hour=1, minute="*/5"), "2026-11-01T04:00",
     [f"{time}-04:00" for time in every_five_minutes("01", "2026-11-01")] + ["2026-11-02T01:00-05:00"]),
    ("cron New York every 30 minutes runs in both passes of the repeated hour",
     lambda: cron(timezone="America/New_York", minute="*/30"), "2026-11-01T05:00",
     ["2026-11-01T01:00-04:00", "2026-11-01T01:30-04:00", "2026-11-01T01:00-05:00", "2026-11-01T01:30-05:00",
      "2026-11-01T02:00-05:00"]),
    # -- every: elapsed time, counted from 2000-01-01 UTC -------------------------
    ("every hour across the Berlin gap: no hour lost or doubled in elapsed time",
     lambda: every(hours=1), "2026-03-29T00:00",
     ["2026-03-29T01:00+01:00", "2026-03-29T03:00+02:00", "2026-03-29T04:00+02:00"]),
    ("every hour across the Berlin repeated hour: both passes fire",
     lambda: every(hours=1), "2026-10-25T00:00",
     ["2026-10-25T02:00+02:00", "2026-10-25T02:00+01:00", "2026-10-25T03:00+01:00"]),
    ("every 24 hours keeps UTC midnight, so the New York wall time moves on spring forward",
     lambda: every(hours=24), "2026-03-07T12:00",
     ["2026-03-07T19:00-05:00", "2026-03-08T20:00-04:00"]),
    ("every 24 hours keeps UTC midnight, so the New York wall time moves on fall back",
     lambda: every(hours=24), "2026-10-31T12:00",
     ["2026-10-31T20:00-04:00", "2026-11-01T19:00-05:00"]),
    # -- calendar_interval: calendar steps at a wall time ---------------------------
    ("calendar daily 02:30 Berlin: the day of the gap fires at 03:30 CEST, not skipped",
     lambda: calendar_interval(timezone="Europe/Berlin", days=1, hour=2, minute=30), "2026-03-28T00:00",
     ["2026-03-28T02:30+01:00", "2026-03-29T03:30+02:00", "2026-03-30T02:30+02:00"]),
    ("calendar daily 02:30 Berlin: the repeated hour fires in the first pass only",
     lambda: calendar_interval(timezone="Europe/Berlin", days=1, hour=2, minute=30), "2026-10-24T00:00",
     ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
    ("calendar weekly on Sundays 02:30 Berlin (start a Sunday): the gap Sunday fires at 03:30 CEST",
     lambda: calendar_interval(timezone="Europe/Berlin", weeks=1, hour=2, minute=30, start=date(2026, 3, 1)),
     "2026-03-23T00:00", ["2026-03-29T03:30+02:00", "2026-04-05T02:30+02:00"]),
    ("calendar daily 02:30 New York: the day of the gap fires at 03:30 EDT",
     lambda: calendar_interval(timezone="America/New_York", days=1, hour=2, minute=30), "2026-03-07T12:00",
     ["2026-03-08T03:30-04:00", "2026-03-09T02:30-04:00"]),
    ("calendar monthly on the 1st 01:30 New York: 1 November's repeated hour fires in the first pass",
     lambda: calendar_interval(timezone="America/New_York", months=1, hour=1, minute=30), "2026-10-15T00:00",
     ["2026-11-01T01:30-04:00", "2026-12-01T01:30-05:00"]),
    # -- once: an absolute instant ------------------------------------------------
    ("once at Berlin 02:30 in the gap (fold=0): the offset before the change, 03:30 CEST",
     lambda: once(datetime(2026, 3, 29, 2, 30, tzinfo=BERLIN)), "2026-03-28T00:00", ["2026-03-29T03:30+02:00"]),
    ("once at Berlin 02:30 on fall-back day, fold=0: the first pass",
     lambda: once(datetime(2026, 10, 25, 2, 30, tzinfo=BERLIN)), "2026-10-24T00:00", ["2026-10-25T02:30+02:00"]),
    ("once at Berlin 02:30 on fall-back day, fold=1: the second pass",
     lambda: once(datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=BERLIN)), "2026-10-24T00:00",
     ["2026-10-25T02:30+01:00"]),
    ("once at New York 02:30 in the gap (fold=0): 03:30 EDT",
     lambda: once(datetime(2026, 3, 8, 2, 30, tzinfo=NEW_YORK)), "2026-03-07T00:00", ["2026-03-08T03:30-04:00"]),
    ("once at New York 01:30 on fall-back day, fold=1: the second pass",
     lambda: once(datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=NEW_YORK)), "2026-10-31T00:00",
     ["2026-11-01T01:30-05:00"]),
]


@pytest.mark.parametrize(("case", "build", "since", "expected"), DST_TABLE, ids=[row[0] for row in DST_TABLE])
def test_fire_times_across_daylight_saving_changes(case, build, since, expected):
    trigger = build()
    start = datetime.fromisoformat(since).replace(tzinfo=UTC)
    fired = fire_times(trigger, start, len(expected) + 1)
    wanted = [datetime.fromisoformat(moment) for moment in expected]
    assert [moment.astimezone(UTC) for moment in fired[: len(expected)]] == [moment.astimezone(UTC) for moment in wanted]
    if isinstance(trigger, DateTrigger):
        assert len(fired) == 1  # a one-shot fires once, whatever the clocks do


def test_cron_fall_back_skip_has_no_try_limit_even_every_second():
    # 3600 fire times in the second pass of Berlin's repeated hour; all skipped in one call.
    trigger = cron(timezone="Europe/Berlin", hour=2, minute="*", second="*")
    first_pass_end = datetime(2026, 10, 25, 0, 59, 59, tzinfo=UTC)  # 02:59:59 CEST
    after = trigger.get_next_fire_time(first_pass_end, first_pass_end + timedelta(milliseconds=3))
    assert after == datetime(2026, 10, 26, 1, 0, tzinfo=UTC)  # 02:00:00 CET, the next day


# -- calendar_interval: every process agrees on the occurrences -------------------


@pytest.mark.parametrize(
    "boot",
    [datetime(2026, 3, 3, 9, tzinfo=UTC), datetime(2026, 3, 17, 22, tzinfo=UTC), datetime(2026, 3, 31, 23, tzinfo=UTC)],
)
def test_leaders_booted_on_different_days_compute_the_same_monthly_occurrences(boot):
    # The fence keys on (job_id, scheduled_for): a monthly job must mean the same instants in every process.
    trigger = calendar_interval(timezone="Europe/Berlin", months=1, hour=6)
    assert fire_times(trigger, boot, 3) == [
        datetime(2026, 4, 1, 6, tzinfo=BERLIN),
        datetime(2026, 5, 1, 6, tzinfo=BERLIN),
        datetime(2026, 6, 1, 6, tzinfo=BERLIN),
    ]


def test_a_starting_scheduler_never_gets_a_past_calendar_occurrence():
    # APScheduler asks with no previous fire time when a scheduler starts; a past answer ran at once on promotion.
    trigger = calendar_interval(timezone="UTC", days=1, hour=6)
    for now in (datetime(2026, 5, 17, 5, 59, tzinfo=UTC), datetime(2026, 5, 17, 6, 0, 0, 1, tzinfo=UTC)):
        first = trigger.get_next_fire_time(None, now)
        assert first >= now
        assert first - now < timedelta(days=1)
    exactly = datetime(2026, 5, 17, 6, tzinfo=UTC)
    assert trigger.get_next_fire_time(None, exactly) == exactly


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: calendar_interval(timezone="UTC", months=2, start=date(2026, 1, 31)),
         ["2026-01-31", "2026-03-31", "2026-05-31", "2026-07-31"]),  # no 31st in those months would be skipped
        (lambda: calendar_interval(timezone="UTC", months=1, start=date(2026, 1, 31)),
         ["2026-01-31", "2026-03-31", "2026-05-31", "2026-07-31"]),  # 31 Feb, Apr, Jun do not exist
        (lambda: calendar_interval(timezone="UTC", years=1, start=date(2024, 2, 29)), ["2024-02-29", "2028-02-29"]),
        (lambda: calendar_interval(timezone="Europe/Berlin", weeks=2, start=datetime(2026, 1, 4, 23, tzinfo=UTC)),
         ["2026-01-05", "2026-01-19"]),  # an aware start counts by its date in the trigger's zone
    ],
)
def test_calendar_steps_from_the_start_date(build, expected):
    fired = fire_times(build(), datetime(2024, 1, 1, tzinfo=UTC), len(expected))
    assert [moment.date().isoformat() for moment in fired] == expected


def test_calendar_interval_describes_itself():
    trigger = calendar_interval(timezone="Europe/Berlin", months=1, hour=6)
    assert str(trigger) == "calendar_interval[every 1 month(s) at 06:00:00 Europe/Berlin, from 2000-01-01]"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: calendar_interval(timezone="UTC"), "not both, not none"),
        (lambda: calendar_interval(timezone="UTC", months=1, days=15), "not both, not none"),
        (lambda: calendar_interval(timezone="UTC", days=-1), "whole numbers"),
        (lambda: calendar_interval(timezone="UTC", days=1.5), "whole numbers"),
        (lambda: calendar_interval(timezone="UTC", days=1, hour=24), "time"),
        (lambda: calendar_interval(timezone="Nowhere/City", days=1), "unknown IANA timezone"),
        (lambda: calendar_interval(timezone="UTC", days=1, start=datetime(2026, 1, 1)), "aware datetime"),
        (lambda: calendar_interval(timezone="UTC", days=1, start="2026-01-01"), "needs a date"),
    ],
)
def test_bad_calendar_intervals_are_refused(build, message):
    with pytest.raises(ConfigurationError, match=message):
        build()


@pytest.mark.parametrize("zone, fall_back_utc", [("Europe/Berlin", "2026-10-25T01:00"), ("America/New_York", "2026-11-01T06:00")])
@pytest.mark.parametrize(
    "fields",
    [{"minute": "*/30"}, {"minute": "*/5"}, {"minute": "*", "second": "*/20"}, {"hour": "0-23", "minute": 15}],
    ids=["every-30-minutes", "every-5-minutes", "every-20-seconds", "hour-range"],
)
def test_cron_fire_times_always_move_forward_through_the_repeated_hour(zone, fall_back_utc, fields):
    # APScheduler alone answers a first-pass time after a second-pass one: back in time, a loop in a scheduler.
    since = datetime.fromisoformat(fall_back_utc).replace(tzinfo=UTC) - timedelta(hours=2)
    fired = [moment.astimezone(UTC) for moment in fire_times(cron(timezone=zone, **fields), since, 700)]
    # (in UTC: Python compares two datetimes of one zone by wall time, blind to the fold)
    assert all(earlier < later for earlier, later in zip(fired, fired[1:], strict=False))
    assert fired[-1] > since + timedelta(hours=3)  # got through the repeated hour


@pytest.mark.parametrize(
    "build",
    [
        lambda: cron(timezone="localtime", hour=3),
        lambda: cron(timezone="EST5EDT", hour=3),
        lambda: calendar_interval(timezone="right/Europe/Berlin", days=1),
        lambda: every(seconds=1e18),
        lambda: every(hours=2**64),
        lambda: calendar_interval(timezone="UTC", years=9000),
    ],
    ids=["localtime", "EST5EDT", "right/", "every 1e18 s", "every 2**64 h", "9000 years"],
)
def test_a_host_dependent_zone_or_a_step_past_100_years_is_a_configuration_error(build):
    with pytest.raises(ConfigurationError):
        build()


def test_a_calendar_interval_ends_at_the_last_year_instead_of_looping():
    trigger = calendar_interval(timezone="UTC", days=1, start=date(9999, 12, 1))
    last = datetime(9999, 12, 30, tzinfo=timezone.utc)
    assert trigger.get_next_fire_time(last, last) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"minute": "61"}, "trigger.fields.minute: '61' is not a valid minute: the highest value is 59"),
        ({"minute": "*/0"}, "trigger.fields.minute: '*/0' is not a valid minute: the step must be higher than 0"),
        ({"hour": "a"}, "trigger.fields.hour: 'a' is not a valid hour"),
        ({"day_of_week": "mun"}, "trigger.fields.day_of_week: 'mun' is not a valid day_of_week: no weekday is named mun"),
    ],
)
def test_a_bad_cron_field_is_one_sentence_naming_the_field(fields, message):
    from outboxkit.errors import InvalidScheduleError
    from outboxkit.schedules.definitions import ScheduleTrigger

    with pytest.raises(InvalidScheduleError) as raised:
        ScheduleTrigger.cron(**fields)
    assert str(raised.value) == message
