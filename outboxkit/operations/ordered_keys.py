"""What an operator sees and does about ordered keys: the stuck heads that block their keys, and the skip.

An outbox with an ordering key (``OutboxOptions.ordering_key``, ``outboxkit.storage.ordering``) delivers its rows one
key at a time in id order, so a ``stuck`` row at the head of its key holds every row of the key behind it.
The operator either retries it (reset, or retry now: the existing actions) or skips it: the row stays
``stuck``, never deleted, and is listed in ``outboxkit_ordering_skips``, so the rows behind it flow.

Skip rules (one id or many, like reset): only a ``stuck`` row with a key that is not skipped yet is
skipped; any other row is left alone and reported with the reason (so repeating a skip is harmless); an
unknown id raises ``RowsNotFound`` and nothing changes; an outbox without an ordering key is refused
(``NotOrderedError``).  A skip is audited (``skip``) with its actor in the same transaction, and wakes
the drain, like a reset.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from outboxkit.errors import NotOrderedError, RowsNotFound
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.operations.controls import record_audit
from outboxkit.operations.schemas import ActionResult, RowOrderingModel, SkippedRow
from outboxkit.storage.drain_queries import quote_table
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.ordering import WAITING_CAP, OrderedStatements, ordered_statements

__all__ = ["BlockedKey", "BlockedKeys", "OrderedKeys"]

BLOCKED_KEYS_LIMIT = 100


class BlockedKey(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    """A stuck head and what it blocks."""

    id: int
    key: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    stuck_since: datetime = Field(description="When the row was last written (its last attempt).")
    waiting: int = Field(description="Rows of the key behind it, not yet delivered (counted up to waiting_cap + 1).")


class BlockedKeys(BaseModel):
    """The stuck heads of one ordered outbox, oldest row first."""

    outbox: str
    ordering_key: str = Field(description="The column the outbox orders by.")
    keys: list[BlockedKey]
    more: bool = Field(description=f"More stuck heads than the first {BLOCKED_KEYS_LIMIT} shown.")
    waiting_cap: int = WAITING_CAP


class OrderedKeys:
    """The ordered outboxes' reads and the skip, over one kit (delegated to by ``OperationsService``)."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit

    def ordering_key(self, outbox_name: str) -> str | None:
        """The column ``outbox_name`` orders by, or None when it is unordered."""
        return self.kit.outbox(outbox_name).__outbox__.ordering_key

    def statements(self, outbox_name: str) -> OrderedStatements:
        """The ordered statements of ``outbox_name``; refused for an outbox without an ordering key."""
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError for a bad name
        statements = _statements(outbox)
        if statements is None:
            raise NotOrderedError(
                f"outbox {outbox_name!r} has no ordering key: its rows are unordered and none blocks another "
                "(skip is for the stuck head of a key; reset or retry a row instead)"
            )
        return statements

    def row_ordering(self, outbox_name: str, row_id: int) -> RowOrderingModel | None:
        """A row's place in its key (None for an outbox without an ordering key, or an unknown row)."""
        statements = _statements(self.kit.outbox(outbox_name))
        if statements is None:
            return None
        with self.kit.operator_database.connect() as connection:
            found = connection.execute(
                text(statements.row_ordering_sql()), {"id": row_id, "outbox": outbox_name}
            ).one_or_none()
        if found is None:
            return None
        return RowOrderingModel(
            key=found.key,
            head=found.key is not None and found.head_id == row_id,
            head_id=found.head_id if found.key is not None else None,
            waiting=found.waiting if found.key is not None else 0,
            waiting_cap=WAITING_CAP,
            skipped=found.skipped,
        )

    def blocked_keys(self, outbox_name: str, *, after: int = 0) -> BlockedKeys:
        """The stuck heads of ``outbox_name`` with the rows waiting behind each, the first ``BLOCKED_KEYS_LIMIT``."""
        statements = self.statements(outbox_name)
        parameters = {"outbox": outbox_name, "after": after, "limit": BLOCKED_KEYS_LIMIT + 1}
        with self.kit.operator_database.connect() as connection:
            found = connection.execute(text(statements.stuck_heads_sql()), parameters).all()
        keys = [
            BlockedKey(
                id=row.id, key=row.key, attempts=row.attempts, last_status_code=row.last_status_code,
                last_error=row.last_error, stuck_since=row.updated_at, waiting=row.waiting,
            )
            for row in found[:BLOCKED_KEYS_LIMIT]
        ]
        ordering_key = self.kit.outbox(outbox_name).__outbox__.ordering_key
        assert ordering_key is not None
        return BlockedKeys(outbox=outbox_name, ordering_key=ordering_key, keys=keys, more=len(found) > BLOCKED_KEYS_LIMIT)

    def skip(self, outbox_name: str, ids: list[int], *, actor: str) -> ActionResult:
        """Skip the listed stuck rows in their keys' order (see the module's rules)."""
        statements = self.statements(outbox_name)
        wanted = sorted(set(ids))
        with self.kit.operator_database.begin() as connection:
            locked = {
                row.id: row
                for row in connection.execute(
                    text(statements.skippable_rows_sql()),
                    {"ids": wanted, "outbox": outbox_name},
                )
            }
            missing = [row_id for row_id in wanted if row_id not in locked]
            if missing:
                raise RowsNotFound(outbox_name, missing)
            skippable = [row.id for row in locked.values() if row.status == "stuck" and row.keyed and not row.skipped]
            changed: list[int] = []
            if skippable:
                changed = sorted(connection.scalars(
                    text(statements.skip_rows_sql()),
                    {"outbox": outbox_name, "ids": skippable, "actor": actor[:300], "now": self.kit.clock.now()},
                ))
            audit_id = None
            if changed:
                audit_id = record_audit(
                    connection, actor=actor, outbox_name=outbox_name, action="skip", ids=changed, row_filter={}
                )
                connection.execute(notify_statement(self.kit.outbox(outbox_name)))  # the rows behind may go now
        done = set(changed)
        skipped = [
            SkippedRow(id=row_id, reason=_not_skipped(locked[row_id].status, locked[row_id].keyed, locked[row_id].skipped))
            for row_id in wanted
            if row_id not in done
        ]
        return ActionResult(
            action="skip", outbox=outbox_name, changed=len(changed), changed_ids=changed, skipped=skipped,
            audit_id=audit_id,
        )


def _statements(outbox: type[Outbox]) -> OrderedStatements | None:
    return ordered_statements(outbox, quote_table(outbox.__table__))  # type: ignore[attr-defined]


def _not_skipped(status: str, keyed: bool, skipped: bool) -> str:
    if skipped:
        return "already skipped"
    if not keyed:
        return "its ordering key is NULL: it is unordered and blocks nothing"
    if status == "done":
        return "delivered; it blocks nothing"
    return "pending: only a stuck row is skipped (a pending one is retried on its own; retry it now instead)"
