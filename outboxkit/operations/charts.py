"""The overview's last hour per outbox, from ``outboxkit_outbox_minutes``.

One primary-key range read for every outbox (60 rows each): the drainers
keep those rows up to date as they work (see ``outboxkit.attempts``), so the
overview never scans the attempt history or the outbox tables for its charts.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import Connection, text

from outboxkit.operations.schemas import MinuteModel

__all__ = ["CHART_MINUTES", "last_hour"]

CHART_MINUTES = 60

LAST_HOUR = """
SELECT outbox, minute, delivered, failed, stuck, pending, due, oldest_due_seconds FROM outboxkit_outbox_minutes
WHERE outbox = ANY(CAST(:outboxes AS text[])) AND minute > :since AND minute <= :until
ORDER BY outbox, minute
"""


def last_hour(connection: Connection, outboxes: list[str], *, now: datetime) -> dict[str, list[MinuteModel]]:
    """Each outbox's minutes of the last hour, oldest first, one entry per minute (empty figures where none was recorded)."""
    until = now.astimezone(timezone.utc).replace(second=0, microsecond=0)
    since = until - timedelta(minutes=CHART_MINUTES)
    found: dict[str, dict[datetime, MinuteModel]] = {name: {} for name in outboxes}
    for row in connection.execute(text(LAST_HOUR), {"outboxes": outboxes, "since": since, "until": until}):
        found[row.outbox][row.minute] = MinuteModel.model_validate(row)
    minutes = [since + timedelta(minutes=step) for step in range(1, CHART_MINUTES + 1)]
    def empty(minute: datetime) -> MinuteModel:
        return MinuteModel(minute=minute, delivered=0, failed=0, stuck=0, pending=None, due=None, oldest_due_seconds=None)

    return {name: [found[name].get(minute) or empty(minute) for minute in minutes] for name in outboxes}
