"""Replay: send delivered rows again, chosen by a filter, in bounded batches, audited.

An operator replays when a receiver lost data it had accepted, or a new
receiver needs the history.  ``Replayer.replay`` takes the ``done`` rows of
one outbox that match a ``RowFilter`` (the row list's filters, with
``delivered_after``/``delivered_before`` and ``updated_*`` as the usual
time ranges) and:

* **dry run** (the default): counts them (exact up to ``REPLAY_COUNT_CAP``,
  then "at least") and samples the newest ids; nothing changes;
* **run**: makes them ``pending``, due now, in batches of ``batch_size``
  rows (``outboxkit.storage.replay_queries``), each batch its own short transaction
  that also records the batch in ``outboxkit_reset_audit`` (action
  ``replay``; the entry's filter carries the replay's id and the batch
  number, so the batches of one replay can be found together) and wakes the
  outbox's drains (NOTIFY on commit).  A replay stopped halfway (a crash, a
  database error) leaves the batches before it replayed and audited, and the
  rest as they were.

What a replayed row is, and why:

* ``attempts`` is reset to 0, as by a reset: a replay is a new delivery
  with the whole retry budget, not a continuation of the old one (a row
  delivered on its last allowed attempt would otherwise be parked as stuck
  by the claim without being sent).  The attempt history keeps the first
  series, marks the replay as it marks a reset, and numbers the replay's
  attempts on from there (``outboxkit.storage.reset_markers``).
* It keeps its ``idempotency_key``, so it is sent with the same
  ``Idempotency-Key`` header as before: a replay is the same event sent
  again, not a new event.  A receiver that still remembers the key drops
  the replayed request as a duplicate (usually answering 2xx, so the row is
  ``done`` again and nothing else happens); a replay reaches only a
  receiver that forgot the key (it lost its data) or never saw it (a new
  receiver).  To make a receiver that still remembers the key process the
  event again, it has to forget that key first; the kit never mints a new
  key for an old row.
* Only ``done`` rows are replayed.  A drain never holds a ``done`` row, and
  a ``pending`` or ``stuck`` row (in flight or not) is never touched, so a
  replay cannot make a row be sent twice at once; the drain's claim (SKIP
  LOCKED and the lease) keeps the replayed rows' own deliveries disjoint.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from outboxkit.errors import InvalidValueError, MigrationRequired
from outboxkit.kit import OutboxKit
from outboxkit.operations.bulk_reset import discard_migrations_checked
from outboxkit.operations.controls import record_audit
from outboxkit.operations.schemas import FilterText, RowFilter
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.replay_queries import replay_queries_for
from outboxkit.storage.reset_markers import marker_parameters
from outboxkit.telemetry.hooks import log_fields

__all__ = [
    "DEFAULT_REPLAY_BATCH",
    "MAX_REPLAY_BATCH",
    "REPLAY_COUNT_CAP",
    "ReplayOutcome",
    "ReplayRequest",
    "Replayer",
]

logger = logging.getLogger(__name__)

DEFAULT_REPLAY_BATCH = 500
MAX_REPLAY_BATCH = 10_000
REPLAY_COUNT_CAP = 100_000
SAMPLE_SIZE = 20

# After a batch: (rows replayed so far, batches so far).
Progress = Callable[[int, int], None]


def _utc(moment: datetime | None) -> datetime | None:
    """A time without an offset is UTC, as the admin shows times."""
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment


# Strict: an ISO 8601 string only (a JSON number is not a time).
FilterTime = Annotated[datetime | None, Field(strict=True), AfterValidator(_utc)]
FilterCount = Annotated[int | None, Field(strict=True, ge=0, le=1_000_000)]


class ReplayRequest(BaseModel):
    """``POST /api/outboxes/{outbox}/replay``: which delivered rows, and whether to act."""

    model_config = ConfigDict(extra="forbid")

    error_contains: FilterText = None
    status_code: Annotated[int | None, Field(strict=True, ge=100, le=599, description="Exact last HTTP status code.")] = None
    created_after: FilterTime = None
    created_before: FilterTime = None
    updated_after: FilterTime = None
    updated_before: FilterTime = None
    delivered_after: FilterTime = Field(default=None, description="delivered_at at or after (ISO 8601; no offset: UTC).")
    delivered_before: FilterTime = Field(default=None, description="delivered_at before (ISO 8601; no offset: UTC).")
    attempts_min: FilterCount = None
    attempts_max: FilterCount = None
    payload_column: Annotated[str | None, Field(max_length=63, description="One of the outbox's own columns.")] = None
    payload_contains: FilterText = None
    dry_run: bool = Field(
        default=True, strict=True, description="Count and sample only; nothing changes. A JSON boolean; defaults to true."
    )
    batch_size: int = Field(
        default=DEFAULT_REPLAY_BATCH,
        strict=True,
        ge=1,
        le=MAX_REPLAY_BATCH,
        description=f"Rows per transaction, 1 to {MAX_REPLAY_BATCH:,} (refused, not clamped).",
    )

    def row_filter(self) -> RowFilter:
        return RowFilter(**self.model_dump(exclude={"dry_run", "batch_size"}))


class ReplayOutcome(BaseModel):
    """What a replay found (dry run) or did."""

    outbox: str
    filter: RowFilter
    dry_run: bool
    matched: int = Field(description=f"Delivered rows matching the filter when it started (counted up to {REPLAY_COUNT_CAP:,}).")
    matched_at_least: bool = Field(description="The count stopped at its cap: at least this many match.")
    sample_ids: list[int] = Field(description=f"Up to {SAMPLE_SIZE} matching ids, newest first.")
    batch_size: int
    replayed: int = Field(description="Rows made pending and due now (0 for a dry run).")
    batches: int = Field(description="Batches (transactions) that replayed rows.")
    replay_id: str | None = Field(description="The id in each of this replay's audit entries (their filter's 'replay').")
    audit_ids: list[int] = Field(description="One audit entry per batch that replayed rows.")


class Replayer:
    """Replays delivered rows of the kit's outboxes (see the module)."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit

    def replay(
        self,
        outbox_name: str,
        row_filter: RowFilter,
        *,
        actor: str,
        dry_run: bool = True,
        batch_size: int = DEFAULT_REPLAY_BATCH,
        progress: Progress | None = None,
    ) -> ReplayOutcome:
        """Count (dry run) or replay the ``done`` rows matching ``row_filter``; refusals change nothing."""
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError for a bad name
        queries = replay_queries_for(outbox)
        queries.check(row_filter)  # InvalidValueError for a payload column the outbox lacks
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_REPLAY_BATCH:
            raise InvalidValueError(f"batch_size must be a whole number from 1 to {MAX_REPLAY_BATCH}, got {batch_size!r}")
        with self.kit.operator_database.connect() as connection:
            matched = queries.count(connection, row_filter, cap=REPLAY_COUNT_CAP)
            sample = queries.sample(connection, row_filter, size=SAMPLE_SIZE)
        outcome = ReplayOutcome(
            outbox=outbox_name,
            filter=row_filter,
            dry_run=dry_run,
            matched=min(matched, REPLAY_COUNT_CAP),
            matched_at_least=matched > REPLAY_COUNT_CAP,
            sample_ids=sample,
            batch_size=batch_size,
            replayed=0,
            batches=0,
            replay_id=None,
            audit_ids=[],
        )
        if dry_run or not matched:
            return outcome
        replay_id = str(uuid.uuid4())
        replayed, audit_ids, after_id = 0, list[int](), 0
        while True:
            with discard_migrations_checked(outbox_name), self.kit.operator_database.begin() as connection:
                batch = queries.replay_batch(
                    connection, row_filter, after_id=after_id, limit=batch_size,
                    now=DatabaseTime(self.kit.clock).read(connection),  # due now by the server's clock
                    marker=marker_parameters(outbox_name, actor, history=self.kit.settings.attempt_history_days > 0),
                )
                if batch.ids:
                    audit_filter = {**row_filter.as_dict(), "replay": replay_id, "batch": len(audit_ids) + 1}
                    audit_ids.append(self._record(connection, actor, outbox_name, batch.ids, audit_filter))
                    connection.execute(notify_statement(outbox))  # delivered on commit: the drains claim at once
            replayed += len(batch.ids)
            if batch.ids and progress is not None:
                progress(replayed, len(audit_ids))
            if batch.last_id is None:
                break
            after_id = batch.last_id
        logger.info(
            "%s: %s replayed %d delivered row(s) in %d batch(es) (replay %s)",
            outbox_name, actor, replayed, len(audit_ids), replay_id,
            extra=log_fields("admin.replayed", outbox_name, None, rows=replayed, batches=len(audit_ids), replay=replay_id),
        )
        return outcome.model_copy(update={"replayed": replayed, "batches": len(audit_ids), "replay_id": replay_id,
                                          "audit_ids": audit_ids})

    @staticmethod
    def _record(connection: Connection, actor: str, outbox_name: str, ids: list[int], audit_filter: dict[str, Any]) -> int:
        """The batch's audit entry, in its transaction (so a refused entry rolls the batch back too)."""
        try:
            return record_audit(
                connection, actor=actor, outbox_name=outbox_name, action="replay", ids=ids, row_filter=audit_filter
            )
        except IntegrityError as exc:
            if "ck_outboxkit_reset_audit_action" not in str(exc.orig):
                raise
            raise MigrationRequired(
                "the reset audit cannot record replays yet: run the kit's migration outboxkit_0004 (`alembic upgrade heads`)"
            ) from None
