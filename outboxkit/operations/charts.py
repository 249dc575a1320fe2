"""The overview's charts per outbox, from ``outboxkit_outbox_minutes``: the last hour, day or week.

One primary-key range read for every outbox: the drainers keep those rows
up to date as they work (see ``outboxkit.storage.attempts``), so the overview never
scans the attempt history or the outbox tables for its charts.  A window is
cut into a fixed number of buckets (``WINDOWS``): 60 of a minute for 1 h,
96 of 15 minutes for 24 h, 84 of 2 hours for 7 d.  In a bucket, deliveries
and failures are summed; the sampled levels (pending, due, the oldest due
row's age) are the bucket's peak, so a short spike is not averaged away.
The 7-day window shows what the retention keeps
(``OUTBOXKIT_ATTEMPT_HISTORY_DAYS``, 7 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import get_args

from sqlalchemy import Connection, text

from outboxkit.operations.schemas import ChartWindow, MinuteModel

__all__ = ["CHART_MINUTES", "CHART_WINDOWS", "WINDOWS", "ChartWindow", "Window", "last_hour", "recent"]

CHART_MINUTES = 60

CHART_WINDOWS: tuple[str, ...] = get_args(ChartWindow)


@dataclass(frozen=True)
class Window:
    """How a chart window is cut: ``buckets`` of ``bucket_seconds`` each, ending at the current minute."""

    buckets: int
    bucket_seconds: int
    label: str  # how far back the window reaches, for the chart's axis: "1 h"


WINDOWS: dict[str, Window] = {
    "1h": Window(buckets=60, bucket_seconds=60, label="1 h"),
    "24h": Window(buckets=96, bucket_seconds=900, label="24 h"),
    "7d": Window(buckets=84, bucket_seconds=7200, label="7 d"),
}

# ``back`` numbers the buckets from the newest (0, holding the current minute) to the oldest.
RECENT = """
SELECT outbox,
       CAST(floor(extract(epoch FROM (CAST(:until AS timestamptz) - minute)) / :step) AS integer) AS back,
       sum(delivered) AS delivered, sum(failed) AS failed, sum(stuck) AS stuck,
       max(pending) AS pending, max(due) AS due, max(oldest_due_seconds) AS oldest_due_seconds
FROM outboxkit_outbox_minutes
WHERE outbox = ANY(CAST(:outboxes AS text[])) AND minute > :since AND minute <= :until
GROUP BY outbox, back
"""


def recent(connection: Connection, outboxes: list[str], *, now: datetime, window: ChartWindow) -> dict[str, list[MinuteModel]]:
    """Each outbox's buckets over ``window``, oldest first, labelled by their newest minute (empty where nothing was recorded)."""
    shape = WINDOWS[window]
    until = now.astimezone(timezone.utc).replace(second=0, microsecond=0)
    step = timedelta(seconds=shape.bucket_seconds)
    since = until - step * shape.buckets
    found: dict[str, dict[int, MinuteModel]] = {name: {} for name in outboxes}
    parameters = {"outboxes": outboxes, "since": since, "until": until, "step": shape.bucket_seconds}
    for row in connection.execute(text(RECENT), parameters):
        found[row.outbox][row.back] = MinuteModel.model_validate({**row._mapping, "minute": until - step * row.back})

    def empty(back: int) -> MinuteModel:
        return MinuteModel(
            minute=until - step * back, delivered=0, failed=0, stuck=0, pending=None, due=None, oldest_due_seconds=None
        )

    backs = range(shape.buckets - 1, -1, -1)
    return {name: [found[name].get(back) or empty(back) for back in backs] for name in outboxes}


def last_hour(connection: Connection, outboxes: list[str], *, now: datetime) -> dict[str, list[MinuteModel]]:
    """Each outbox's minutes of the last hour, oldest first, one entry per minute (empty figures where none was recorded)."""
    return recent(connection, outboxes, now=now, window="1h")
