"""Jinja2 for the admin pages: the environment, its filters, the vendored assets.

Templates and the stylesheet load from the package (``PackageLoader``), so an
installed wheel serves them with no source tree and no network.  Everything is
autoescaped; ``visible`` additionally shows bidirectional control characters
as ``⟨U+202E⟩`` so a payload cannot reorder the text around it.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from importlib import resources

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from outboxkit.admin.chart_svg import chart_svg

__all__ = ["STATIC_FILES", "age", "counts_shown", "make_environment", "static_file", "visible"]

STATIC_FILES = {
    "admin.css": "text/css; charset=utf-8",
    "admin.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def age(moment: datetime | None, now: datetime) -> str:
    """``3 min ago`` / ``in 5 s``: coarse, for reading at a glance."""
    if moment is None:
        return "—"
    seconds = (now - moment).total_seconds()
    span = abs(seconds)
    if span < 1:
        return "now"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if span >= size:
            amount = f"{int(span // size)} {unit}"
            break
    return f"in {amount}" if seconds < 0 else f"{amount} ago"


def utc(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3.5 h``: an age for a chart's legend."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def form_time(moment: datetime | None) -> str:
    """A time as a ``datetime-local`` input's value, in UTC (the pages read such values as UTC)."""
    if moment is None:
        return ""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


# A job run's counts in this order (the drain's), then any others by name.
COUNT_ORDER = ("delivered", "retried", "stuck", "lost", "claimed", "batches")


def counts_shown(counts: dict[str, object]) -> list[tuple[str, str]]:
    """A run's counts as (figure, name) pairs to show: ``("1,180", "delivered")``; zeros and empty values left out."""
    names = [name for name in COUNT_ORDER if name in counts] + sorted(name for name in counts if name not in COUNT_ORDER)
    shown = []
    for name in names:
        value = counts[name]
        if value is None or value == "" or (isinstance(value, int | float) and not isinstance(value, bool) and value == 0):
            continue
        figure = f"{value:,}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)[:40]
        shown.append((figure, name.replace("_", " ")))
    return shown


def visible(value: object) -> str:
    """The text with bidi controls made visible (escaping itself is Jinja's autoescape)."""
    if value is None:
        return ""
    return _BIDI_CONTROLS.sub(lambda match: f"⟨U+{ord(match.group()):04X}⟩", str(value))


def make_environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("outboxkit.admin", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(age=age, utc=utc, visible=visible, form_time=form_time, counts_shown=counts_shown)
    environment.globals.update(chart_svg=chart_svg, duration=duration)
    return environment


def static_file(name: str) -> bytes:
    """A vendored asset shipped in the package."""
    return resources.files("outboxkit.admin").joinpath("static", name).read_bytes()
