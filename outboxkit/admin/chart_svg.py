"""Server-rendered SVG charts for the overview: readable with no script and no network.

``chart_svg`` draws one series of a chart window (one value per bucket,
``None`` where nothing was recorded) as bars (counts per bucket) or a line
(sampled levels: backlog, oldest due age), scaled to its own peak, with
axes: the value scale on the left (0 and the peak) and the time scale below
(how far back the window reaches, the middle bucket's time in UTC, and
"now").  Each bar, and each point of
a line, carries a ``<title>`` with its time and value, which a browser
shows on hover.  The SVG uses presentation attributes and classes from the
vendored stylesheet (the CSP allows no inline ``style``); numbers and times
are the only data in it, and the title says in words what it shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Literal

from markupsafe import Markup, escape

__all__ = ["chart_svg", "compact_number"]

WIDTH = 300
HEIGHT = 84
LEFT = 38  # room for the value scale
RIGHT = 2
TOP = 4  # room for the peak's line
BASELINE = HEIGHT - 14  # below it: the time scale


def compact_number(value: float) -> str:
    """``950``, ``12k``, ``1.2M``: a scale label that fits the chart's margin."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M".replace(".0M", "M")
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:,.0f}" if value >= 1 or value == 0 else f"{value:.2f}"


def chart_svg(
    values: Sequence[float | None],
    *,
    kind: Literal["bars", "line"],
    css_class: str,
    title: str,
    times: Sequence[datetime] = (),
    span: str = "1 h",
    value_text: Callable[[float], str] = compact_number,
) -> Markup:
    """One series as an inline ``<svg>`` (see the module); ``times`` label each value, ``span`` the window's start."""
    known = [value for value in values if value is not None]
    peak = max(known, default=0) or 1
    step = (WIDTH - LEFT - RIGHT) / max(len(values), 1)

    def y(value: float) -> float:
        return round(BASELINE - (BASELINE - TOP) * value / peak, 1)

    def hover(index: int, value: float) -> str:
        when = times[index].astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if index < len(times) else ""
        return f"<title>{escape(when)}{': ' if when else ''}{escape(value_text(value))}</title>"

    shapes: list[str] = []
    if kind == "bars":
        for index, value in enumerate(values):
            if value:
                top = y(value)
                shapes.append(
                    f'<rect x="{LEFT + index * step + 0.5:.1f}" y="{top}" width="{max(step - 1, 1):.1f}" '
                    f'height="{BASELINE - top:.1f}">{hover(index, value)}</rect>'
                )
    else:
        run: list[str] = []
        for index, value in enumerate(list(values) + [None]):
            if value is None:
                if len(run) == 1:
                    x, level = run[0].split(",")
                    shapes.append(f'<circle cx="{x}" cy="{level}" r="1.5"/>')
                elif run:
                    shapes.append(f'<polyline points="{" ".join(run)}" fill="none"/>')
                run = []
            else:
                run.append(f"{LEFT + index * step + step / 2:.1f},{y(value)}")
                # an invisible column over the point, so hovering near it shows its value
                shapes.append(
                    f'<rect class="hit" x="{LEFT + index * step:.1f}" y="{TOP}" width="{step:.1f}" '
                    f'height="{BASELINE - TOP}">{hover(index, value)}</rect>'
                )
    highest = max(known, default=0.0)
    peak_label = value_text(highest) if highest else "—"  # nothing above 0: no scale to show
    middle = ""
    if len(times) == len(values) and len(times) > 2:  # the middle bucket's clock time, in UTC
        moment = times[len(times) // 2].astimezone(timezone.utc)
        label = moment.strftime("%b %d, %H:%M UTC") if times[-1] - times[0] > timedelta(days=2) else moment.strftime("%H:%M UTC")
        center = LEFT + (len(times) // 2) * step + step / 2
        middle = f'<text class="tick" x="{center:.1f}" y="{HEIGHT - 3}" text-anchor="middle">{escape(label)}</text>'
        middle += f'<line class="axis" x1="{center:.1f}" y1="{BASELINE}" x2="{center:.1f}" y2="{BASELINE + 3}"/>'

    axes = (
        f'<line class="axis" x1="{LEFT - 0.5}" y1="{TOP}" x2="{LEFT - 0.5}" y2="{BASELINE}"/>'
        f'<line class="axis" x1="{LEFT}" y1="{BASELINE + 0.5}" x2="{WIDTH - RIGHT}" y2="{BASELINE + 0.5}"/>'
        f'<line class="peak" x1="{LEFT}" y1="{TOP}" x2="{WIDTH - RIGHT}" y2="{TOP}"/>'
        f'<text class="tick" x="{LEFT - 3}" y="{TOP + 7}" text-anchor="end">{escape(peak_label)}</text>'
        f'<text class="tick" x="{LEFT - 3}" y="{BASELINE}" text-anchor="end">0</text>'
        f'<text class="tick" x="{LEFT}" y="{HEIGHT - 3}" text-anchor="start">−{escape(span)}</text>'
        f'<text class="tick" x="{WIDTH - RIGHT}" y="{HEIGHT - 3}" text-anchor="end">now</text>{middle}'
    )
    return Markup(
        f'<svg class="chart chart-{escape(css_class)}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>{axes}{''.join(shapes)}</svg>"
    )
