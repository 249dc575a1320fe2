"""The overview chart's SVG: scaled to its peak, with gaps for unsampled minutes.

The per-minute figures the drainers keep are in tests/integration/test_admin_charts.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

from outboxkit.admin.chart_svg import chart_svg
from tests.support.admin import (  # noqa: F401  (fixtures)
    START,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
)


def test_a_chart_scales_to_its_peak_and_leaves_gaps_for_unsampled_minutes():
    line = chart_svg([None, 2, 4, None, 1], kind="line", css_class="backlog", title="due <rows>")
    bars = chart_svg([0, 3, 0], kind="bars", css_class="delivered", title="t")
    assert line.count("<polyline") == 1 and line.count("<circle") == 1  # 2-4 joined, 1 alone after a gap
    assert 'y="4.0"' not in line and ",4.0" in line  # the peak reaches the top line
    assert "due &lt;rows&gt;" in line
    assert bars.count("<rect") == 1


def test_a_chart_has_a_value_scale_a_time_scale_and_hover_values():
    times = [START - timedelta(minutes=59 - index) for index in range(60)]
    svg = chart_svg([0] * 59 + [1234], kind="bars", css_class="delivered", title="t", times=times, span="1 h")
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', svg)
    assert ticks == ["1,234", "0", "−1 h", "now", "11:31 UTC"]  # the middle bucket
    assert "<title>2030-01-01 12:00 UTC: 1,234</title>" in svg
