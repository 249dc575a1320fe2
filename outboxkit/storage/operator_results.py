"""What the operator's statements return: counts, row summaries, a row's detail, its state under a lock.

Plain values, built by ``outboxkit.storage.operator_queries`` from the rows it
reads; the admin service and the CLI turn them into what they show.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

__all__ = ["DeletedBatch", "OrderedBacklog", "PayloadField", "RowDetail", "RowState", "RowSummary", "StatusCounts"]


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
    # Rows a person discarded: kept, never sent, counted apart from stuck (exact up to the same limit).
    discarded: int = 0
    discarded_estimated: bool = False
    # An outbox with an ordering key: its pending rows waiting behind their key's head (None without a key).
    # Estimated when pending is, or when the walk stopped at its key limit (then an upper bound).
    held_by_order: int | None = None
    held_by_order_estimated: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderedBacklog:
    """What is due in an outbox with an ordering key (``outboxkit.storage.ordering.ORDERED_BACKLOG``).

    Due rows are the due unkeyed rows and the due pending heads; the rows behind a head are held by order.
    ``more_keys``: the walk stopped at its key limit, the keys past it counted no head.
    """

    keys_visited: int
    more_keys: bool
    pending_heads: int
    due_heads: int
    oldest_due_head: datetime | None
    beyond_oldest_due: datetime | None
    pending_unkeyed: int
    due_unkeyed: int | None  # counted only when asked for (``with_due``)
    oldest_due_unkeyed: datetime | None

    @property
    def due(self) -> int | None:
        """Rows a claim could take now (a lower bound when ``more_keys``); None when read without ``with_due``."""
        return None if self.due_unkeyed is None else self.due_unkeyed + self.due_heads

    @property
    def oldest_due_at(self) -> datetime | None:
        """The oldest sendable due row's due time (past the key limit, the keys not visited count their oldest due row)."""
        dues = [due for due in (self.oldest_due_head, self.beyond_oldest_due, self.oldest_due_unkeyed) if due is not None]
        return min(dues, default=None)

    def held_by_order(self, pending: int) -> int:
        """The pending rows behind their key's head, given every pending row counted (an upper bound when ``more_keys``)."""
        return max(0, pending - self.pending_unkeyed - self.pending_heads)


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
