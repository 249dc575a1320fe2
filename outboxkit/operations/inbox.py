"""The inbox for operators: per source, received, duplicates dropped, last received and handler failures.

The admin (``GET /api/inbox`` and the Inbox page) and the CLI (``outboxkit
inbox``) read it through ``InboxOperations``, on the kit's operator database
(its own small pool, a time budget per transaction).  The figures come from
the inbox's tables (``outboxkit.inbox.views``): ``received`` counts the
records kept in the retention window, the others only grow.  Nothing here
changes a row: the inbox has no operator action.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from outboxkit.inbox.views import inbox_summaries
from outboxkit.kit import OutboxKit

__all__ = ["InboxOperations", "InboxSourceModel", "InboxView"]


class InboxSourceModel(BaseModel):
    """One source of the inbox (a sender, as the receiver names it)."""

    model_config = ConfigDict(from_attributes=True)

    source: str
    received: int = Field(description="Messages recorded and still kept (the retention window).")
    last_received_at: datetime | None
    duplicates: int = Field(description="Deliveries of messages already handled: acknowledged, handler not run.")
    last_duplicate_at: datetime | None
    handler_failures: int = Field(description="Deliveries whose handler raised: rolled back, answered 5xx.")
    last_failure_at: datetime | None
    last_error: str | None


class InboxView(BaseModel):
    """Every source of the inbox, by name."""

    generated_at: datetime
    retention_days: float | None = Field(description="OUTBOXKIT_INBOX_RETENTION_DAYS; None: records are kept.")
    sources: list[InboxSourceModel]


class InboxOperations:
    """Reads the inbox of one kit's database."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit

    def view(self) -> InboxView:
        with self.kit.operator_database.connect() as connection:
            summaries = inbox_summaries(connection)
        return InboxView(
            generated_at=self.kit.clock.now(),
            retention_days=self.kit.settings.inbox_retention_days,
            sources=[InboxSourceModel.model_validate(summary) for summary in summaries],
        )
