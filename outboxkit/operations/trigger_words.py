"""Triggers written for people: ``every 5 seconds (UTC)``, ``every day at 02:00 (Europe/Berlin)``.

``describe_trigger`` takes a trigger object (APScheduler's interval, cron
and date triggers and outboxkit's ``AnchoredCalendarTrigger``) and names
its timezone.  A job source that only gives the trigger's ``str()`` gets it
described from that text (``interval[0:00:05]``, ``cron[hour='2',
minute='0']``, ``date[...]``); such text carries no timezone, so the
description says the job source did not name one.  Anything else is shown
as given.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from outboxkit.schedules.triggers import AnchoredCalendarTrigger

__all__ = ["describe_trigger"]

_NO_ZONE = "timezone not given by the job source"
_FIELD_WORDS = {"day_of_week": "day of week", "day": "day of month"}
_TEXT_INTERVAL = re.compile(r"^interval\[(?:(\d+) days?, )?(\d+):(\d\d):(\d\d)(?:\.\d+)?\]$")
_TEXT_CRON = re.compile(r"^cron\[(.*)\]$")
_TEXT_FIELD = re.compile(r"(\w+)='([^']*)'")
_TEXT_DATE = re.compile(r"^date\[(.+)\]$")


def describe_trigger(trigger: Any) -> str:
    """A sentence for a trigger object or its ``str()``; see the module."""
    if isinstance(trigger, IntervalTrigger):
        return f"every {_span(trigger.interval)} ({_zone_name(trigger.timezone)})"
    if isinstance(trigger, CronTrigger):
        fields = {field.name: str(field) for field in trigger.fields if not field.is_default}
        return f"{_cron_words(fields)} ({_zone_name(trigger.timezone)})"
    if isinstance(trigger, DateTrigger):
        moment: datetime = trigger.run_date
        return f"once, at {moment:%Y-%m-%d %H:%M:%S} ({_zone_name(moment.tzinfo)})"
    if isinstance(trigger, AnchoredCalendarTrigger):
        step = f"{trigger.days} days" if trigger.days else f"{trigger.months} months"
        if trigger.days == 1 or trigger.months == 1:
            step = "day" if trigger.days else "month"
        elif trigger.days and trigger.days % 7 == 0:
            step = "week" if trigger.days == 7 else f"{trigger.days // 7} weeks"
        return f"every {step} at {trigger.at:%H:%M} ({trigger.timezone.key}), counted from {trigger.start}"
    return _describe_text(str(trigger)) if trigger is not None else "—"


def _describe_text(text: str) -> str:
    if match := _TEXT_INTERVAL.match(text):
        days, hours, minutes, seconds = (int(value or 0) for value in match.groups())
        return f"every {_span(timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds))} ({_NO_ZONE})"
    if match := _TEXT_CRON.match(text):
        fields = dict(_TEXT_FIELD.findall(match.group(1)))
        if fields:
            return f"{_cron_words(fields)} ({_NO_ZONE})"
    if match := _TEXT_DATE.match(text):
        return f"once, at {match.group(1)}"
    return text


def _span(interval: timedelta) -> str:
    seconds = int(interval.total_seconds())
    if seconds <= 0:
        return f"{interval.total_seconds():g} seconds"
    parts = []
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount} {unit}" + ("s" if amount > 1 else ""))
    if len(parts) == 1 and parts[0].startswith("1 "):
        return parts[0][2:]  # "every minute", not "every 1 minute"
    return " ".join(parts)


def _zone_name(zone: Any) -> str:
    if zone is None:
        return "UTC"
    name = getattr(zone, "key", None) or getattr(zone, "zone", None) or str(zone)
    return "UTC" if name in ("UTC", "utc", "Etc/UTC") else str(name)


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def _cron_words(fields: dict[str, str]) -> str:
    """Cron fields as a phrase; the common shapes read naturally, any other lists its fields."""
    hour, minute, second = (_number(fields.get(name, "0")) for name in ("hour", "minute", "second"))
    calendar = {name: value for name, value in fields.items() if name not in ("hour", "minute", "second")}
    at = None
    if hour is not None and minute is not None and second is not None and "hour" in fields:
        at = f"{hour:02d}:{minute:02d}" + (f":{second:02d}" if second else "")
    if at and not calendar:
        return f"every day at {at}"
    if at and set(calendar) == {"day_of_week"}:
        return f"every {calendar['day_of_week']} at {at}"
    if at and set(calendar) == {"day"}:
        return f"on day {calendar['day']} of every month at {at}"
    if set(fields) <= {"minute", "second"} and minute is not None and (second or 0) == 0:
        return f"every hour at minute {minute}"
    step = re.fullmatch(r"\*/(\d+)", fields.get("minute", ""))
    if step and set(fields) <= {"minute", "second"}:
        return f"every {step.group(1)} minutes"
    described = ", ".join(f"{_FIELD_WORDS.get(name, name.replace('_', ' '))} {value}" for name, value in fields.items())
    return f"cron: {described}"
