"""What the operator's statements return: counts, row summaries, a row's detail, its state under a lock.

Plain values, built by ``outboxkit.operator_queries`` from the rows it
reads; the admin service and the CLI turn them into what they show.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

__all__ = ["DeletedBatch", "PayloadField", "RowDetail", "RowState", "RowSummary", "StatusCounts"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusCounts:
    """One outbox's counts.  A count is exact only when its ``*_estimated`` flag is False."""

    pending: int
    in_flight: int
    stuck: int
    done: int
    done_estimated: bool
    oldest_due_at: datetime | None
    pending_estimated: bool = False
    stuck_estimated: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class DeletedBatch:
    """What one retention statement did: rows deleted, where the window ended, whether to go on."""

    deleted: int
    last_id: int | None
    created_before_cutoff: int

    @property
    def more_may_follow(self) -> bool:
        """False once the window was empty or held no row created before the cutoff."""
        return self.last_id is not None and self.created_before_cutoff > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSummary:
    """A row as a list shows it: the kit's columns, ``last_error`` cut to ``operator_queries.LIST_ERROR_CHARS``."""

    id: int
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    last_error_length: int | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    claimed_until: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PayloadField:
    """One application column of a row, as text cut in SQL to the preview size."""

    name: str
    type: str
    text: str | None
    length: int | None

    @property
    def truncated(self) -> bool:
        return self.text is not None and self.length is not None and self.length > len(self.text)


@dataclass(frozen=True, kw_only=True, slots=True)
class RowDetail:
    summary: RowSummary
    idempotency_key: uuid.UUID
    claim_token: uuid.UUID | None
    payload: list[PayloadField]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowState:
    """What an action may do with a row, read under its lock."""

    id: int
    status: str
    next_attempt_at: datetime
    claimed_until: datetime | None

    def held(self, now: datetime) -> bool:
        """A drain holds the row: it is pending with a live lease."""
        return self.status == "pending" and self.claimed_until is not None and self.claimed_until > now

    def in_backoff(self, now: datetime) -> bool:
        return self.status == "pending" and not self.held(now) and self.next_attempt_at > now
