"""What an operator reads about the inbox: per source, received, duplicates dropped, last received, failures.

One statement over ``outboxkit_inbox`` (the records kept in the retention
window, counted per source on the primary key) joined with
``outboxkit_inbox_sources`` (the counts that outlive the records).  A source
appears once it has a record, a duplicate or a failure.  ``received`` counts
the records still kept, so it drops when retention prunes; ``duplicates`` and
``handler_failures`` only grow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select

from outboxkit.storage.tables import inbox, inbox_sources

__all__ = ["InboxSourceSummary", "inbox_summaries"]


@dataclass(frozen=True, kw_only=True)
class InboxSourceSummary:
    """One source of the inbox, as an operator sees it."""

    source: str
    received: int
    last_received_at: datetime | None
    duplicates: int
    last_duplicate_at: datetime | None
    handler_failures: int
    last_failure_at: datetime | None
    last_error: str | None


def inbox_summaries(connection: Connection) -> list[InboxSourceSummary]:
    """Every source of the inbox, by name."""
    records = (
        select(inbox.c.source, func.count().label("received"), func.max(inbox.c.received_at).label("last_received_at"))
        .group_by(inbox.c.source)
        .subquery()
    )
    source = func.coalesce(records.c.source, inbox_sources.c.source).label("source")
    statement = (
        select(
            source,
            func.coalesce(records.c.received, 0),
            records.c.last_received_at,
            func.coalesce(inbox_sources.c.duplicates, 0),
            inbox_sources.c.last_duplicate_at,
            func.coalesce(inbox_sources.c.handler_failures, 0),
            inbox_sources.c.last_failure_at,
            inbox_sources.c.last_error,
        )
        .select_from(records.join(inbox_sources, records.c.source == inbox_sources.c.source, full=True))
        .order_by(source)
    )
    return [
        InboxSourceSummary(
            source=row[0], received=int(row[1]), last_received_at=row[2], duplicates=int(row[3]),
            last_duplicate_at=row[4], handler_failures=int(row[5]), last_failure_at=row[6], last_error=row[7],
        )
        for row in connection.execute(statement)
    ]
