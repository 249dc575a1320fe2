"""Server-rendered SVG charts for the overview: readable with no script and no network.

``chart_svg`` draws one series of the last hour (one value per minute,
``None`` where nothing was recorded) as bars (counts per minute) or a line
(sampled levels: backlog, oldest due age), scaled to its own peak.  The SVG
uses presentation attributes and classes from the vendored stylesheet (the
CSP allows no inline ``style``); numbers are the only data in it, and the
title says in words what it shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from markupsafe import Markup, escape

__all__ = ["chart_svg"]

WIDTH = 240
HEIGHT = 56
TOP = 4  # room for the peak's line


def chart_svg(values: Sequence[float | None], *, kind: Literal["bars", "line"], css_class: str, title: str) -> Markup:
    """One series as an inline ``<svg>`` (see the module)."""
    known = [value for value in values if value is not None]
    peak = max(known, default=0) or 1
    step = WIDTH / max(len(values), 1)

    def y(value: float) -> float:
        return round(HEIGHT - (HEIGHT - TOP) * value / peak, 1)

    shapes: list[str] = []
    if kind == "bars":
        for index, value in enumerate(values):
            if value:
                top = y(value)
                shapes.append(
                    f'<rect x="{index * step + 0.5:.1f}" y="{top}" width="{max(step - 1, 1):.1f}" height="{HEIGHT - top:.1f}"/>'
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
                run.append(f"{index * step + step / 2:.1f},{y(value)}")
    return Markup(
        f'<svg class="chart chart-{escape(css_class)}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
        f'<line class="axis" x1="0" y1="{HEIGHT - 0.5}" x2="{WIDTH}" y2="{HEIGHT - 0.5}"/>'
        f'<line class="peak" x1="0" y1="{TOP}" x2="{WIDTH}" y2="{TOP}"/>'
        f"{''.join(shapes)}</svg>"
    )
