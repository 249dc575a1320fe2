"""What an operator does, independent of HTTP: the one service behind the admin (API and pages) and the CLI.

(A few lines past 400: it is the one facade the admin and the CLI call; each capability with logic of its own
already lives beside it — controls, bulk reset, replay, export, the jobs table — and is only delegated to here.)

``OperationsService`` reads counts, pages and rows, and performs resets, through
the named statements in ``outboxkit.storage.operator_queries``; it records every change in
``outboxkit_reset_audit`` in the same transaction as the change.  The JSON
API and the pages are thin layers over it.  It works on the kit's operator
database (``outboxkit.storage.operator_pool``): a small pool of its own, never the
application's connections, and a time limit on every transaction.

Action rules (the same for one id, a list, or a filter):

* reset: ``stuck`` -> ``pending``, attempts 0, due now, claim cleared;
* retry now: ``pending`` in backoff -> due now (attempts kept);
* a row a drain holds (pending, ``claimed_until`` in the future) is refused:
  the whole request raises ``RowsHeld`` and nothing changes;
* an unknown id raises ``RowsNotFound`` and nothing changes;
* any other row is left alone and reported as skipped, so repeating an
  action is harmless (idempotent);
* a change is audited with its actor; a request that changed nothing is not;
* a change wakes the drain: ``pg_notify`` on the outbox's channel in the same
  transaction, so a listening drainer wakes when the reset commits (never
  before: PostgreSQL delivers notifications on commit) instead of at the
  next interval run.

One module: one method per operator action, each a thin transaction over the statements; the
destinations, schedules, inbox and ordered keys have services of their own beside it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, cast

from sqlalchemy import Connection, select

from outboxkit.errors import InvalidSearch, RowsHeld, RowsNotFound
from outboxkit.kit import OutboxKit
from outboxkit.operations.bulk_reset import REQUEST_SECONDS, BulkReset, discard_migrations_checked
from outboxkit.operations.charts import WINDOWS, recent
from outboxkit.operations.controls import OutboxControls, record_audit
from outboxkit.operations.cursor import InvalidCursor, decode_cursor, encode_cursor
from outboxkit.operations.destination_limits import DestinationLimitOperations
from outboxkit.operations.destinations import DestinationOperations
from outboxkit.operations.export import RowExport
from outboxkit.operations.history import row_attempts
from outboxkit.operations.job_status import JobSource, drain_job_id, last_runs, leaders
from outboxkit.operations.jobs_table import JobsTable, run_model
from outboxkit.operations.ordered_keys import OrderedKeys
from outboxkit.operations.outage import held_back, ordered
from outboxkit.operations.replay import Replayer
from outboxkit.operations.schemas import (
    MAX_ROW_ID,
    STATUS_VALUES,
    ActionResult,
    AttemptModel,
    AuditEntry,
    AuditPage,
    ChartModel,
    ChartWindow,
    FoundRow,
    HeldByDestination,
    JobRunsView,
    JobsView,
    LeaderModel,
    MatchOutcome,
    OutboxCounts,
    OutboxOverview,
    Overview,
    PayloadFieldModel,
    RowDetailModel,
    RowPage,
    RowSummaryModel,
    SkippedRow,
    Status,
    StatusCount,
)
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.operator_queries import AdminQueries, admin_queries_for
from outboxkit.storage.operator_results import RowState, RowSummary
from outboxkit.storage.pauses import Pause, paused_outboxes
from outboxkit.storage.reset_markers import marker_parameters
from outboxkit.storage.row_filter import RowFilter
from outboxkit.storage.tables import reset_audit

__all__ = ["OperationsService", "InvalidSearch", "RowsHeld", "RowsNotFound"]

# Tab counts under a filter count at most this many rows per status ("10,000+" beyond).
FILTERED_COUNT_CAP = 10_000


ActionName = Literal["reset", "retry_now", "discard"]


class OperationsService:
    """The operator's reads and actions over one kit, shared by the admin and the CLI."""

    def __init__(self, kit: OutboxKit, *, job_source: JobSource | None = None, preview_chars: int = 10_000) -> None:
        self.kit = kit
        self.job_source = job_source
        self.preview_chars = preview_chars
        self.controls = OutboxControls(kit)  # pause, resume, drain now
        self.jobs_table = JobsTable(kit, job_source)  # the jobs page
        self.replays = Replayer(kit)  # send delivered rows again (outboxkit.operations.replay)
        self.exports = RowExport(kit)  # stream rows as NDJSON or CSV (outboxkit.operations.export)
        self.bulk_reset = BulkReset(kit)  # reset all matching, in batches
        self.destinations = DestinationOperations(kit)  # destinations: state, resume, disable, probe now
        self.destination_limits = DestinationLimitOperations(kit)  # an operator's rate limit and cap of a destination
        self.ordered_keys = OrderedKeys(kit)  # stuck heads of ordered keys, and the skip

    @property
    def outbox_names(self) -> list[str]:
        return [outbox.__outbox__.job_name for outbox in self.kit.outboxes]

    def payload_columns(self, outbox_name: str) -> list[str]:
        """The outbox's own columns, which a payload filter may name."""
        return self._queries(outbox_name).payload_column_names

    def _queries(self, outbox_name: str) -> AdminQueries:
        return admin_queries_for(self.kit.outbox(outbox_name))  # UnknownOutboxError for a bad name

    # -- reads ---------------------------------------------------------------

    def overview(self, *, charts: bool = False, window: ChartWindow = "1h") -> Overview:
        """Every outbox's counts and heartbeat, and who leads; with ``charts``, each outbox's figures over ``window``."""
        now = self.kit.clock.now()
        names = self.outbox_names
        with self.kit.operator_database.connect() as connection:
            runs = last_runs(connection, [drain_job_id(name) for name in names])
            pauses = paused_outboxes(connection)
            held = {name: held_back(self.destinations, connection, self.kit.outbox(name)) for name in names}
            entries = [self._outbox_overview(connection, name, runs, pauses, now, held[name]) for name in names]
            if charts:
                figures = recent(connection, names, now=now, window=window)
                seconds = WINDOWS[window].bucket_seconds
                entries = [
                    entry.model_copy(
                        update={
                            "chart": ChartModel(window=window, bucket_seconds=seconds, buckets=figures[entry.name]),
                            "last_hour": figures[entry.name] if window == "1h" else None,
                        }
                    )
                    for entry in entries
                ]
            key = self.kit.settings.advisory_lock_key
            holders = [LeaderModel.model_validate(holder) for holder in leaders(connection, key=key)]
        return Overview(
            generated_at=now,
            leader=holders[0] if holders else None,
            leaders=holders,
            outboxes=entries,
            held_back=ordered([entry for entries_of_one in held.values() for entry in entries_of_one]),
        )

    def outbox_overview(self, outbox_name: str) -> OutboxOverview:
        """One outbox's counts and heartbeat."""
        self._queries(outbox_name)
        with self.kit.operator_database.connect() as connection:
            runs = last_runs(connection, [drain_job_id(outbox_name)])
            pauses = paused_outboxes(connection)
            held = held_back(self.destinations, connection, self.kit.outbox(outbox_name))
            return self._outbox_overview(connection, outbox_name, runs, pauses, self.kit.clock.now(), held)

    def _outbox_overview(
        self,
        connection: Connection,
        name: str,
        runs: dict[str, Any],
        pauses: dict[str, Pause],
        now: datetime,
        held: list[HeldByDestination],
    ) -> OutboxOverview:
        queries = self._queries(name)
        counts = queries.status_counts(connection, now=now)
        oldest = counts.oldest_due_at
        return OutboxOverview(
            name=name,
            table=queries.table_name,
            counts=OutboxCounts.model_validate(counts),
            oldest_due_at=oldest,
            oldest_due_age_seconds=(now - oldest).total_seconds() if oldest else None,
            drain_job_id=drain_job_id(name),
            last_drain=run_model(runs.get(drain_job_id(name))),
            held_by_destination=sum(entry.waiting_rows for entry in held),
            held_by_destination_at_least=any(entry.waiting_rows_at_least for entry in held),
            paused=name in pauses,
            paused_by=pauses[name].paused_by if name in pauses else None,
            paused_at=pauses[name].paused_at if name in pauses else None,
        )

    def rows(
        self,
        outbox_name: str,
        *,
        status: str,
        row_filter: RowFilter,
        cursor: str | None,
        limit: int,
        with_counts: bool = False,
    ) -> RowPage:
        """One keyset page of one status; ``cursor`` is a page's ``next_cursor`` or ``previous_cursor``.

        ``with_counts`` adds each status's count under the same filter (exact
        up to ``FILTERED_COUNT_CAP``, then "at least"; without a filter, the
        overview's counts).
        """
        queries = self._queries(outbox_name)
        scope, with_time = f"rows:{status}", status == "pending"
        after = before = None
        if cursor:
            try:
                after = decode_cursor(cursor, scope=scope, with_time=with_time)
            except InvalidCursor:
                before = decode_cursor(cursor, scope=scope + ":before", with_time=with_time)
        now = self.kit.clock.now()
        with self.kit.operator_database.connect() as connection:
            found = queries.page(connection, status=status, row_filter=row_filter, after=after, before=before, limit=limit + 1)
            counts = self._tab_counts(connection, queries, row_filter, now) if with_counts else None
        more = len(found) > limit
        rows = (found[1:] if before is not None else found[:limit]) if more else found

        def key(row: RowSummary) -> tuple[Any, ...]:
            return (row.next_attempt_at, row.id) if with_time else (row.id,)

        # Forwards: earlier rows exist once a cursor was followed.  Backwards: later rows always do.
        has_next = more if before is None else bool(rows)
        has_previous = (after is not None) if before is None else more
        return RowPage(
            outbox=outbox_name,
            status=cast(Status, status),
            filter=row_filter,
            limit=limit,
            rows=[_summary(row, now) for row in rows],
            next_cursor=encode_cursor(scope, key(rows[-1])) if has_next and rows else None,
            previous_cursor=encode_cursor(scope + ":before", key(rows[0])) if has_previous and rows else None,
            counts=counts,
        )

    def _tab_counts(
        self, connection: Connection, queries: AdminQueries, row_filter: RowFilter, now: datetime
    ) -> list[StatusCount]:
        if not row_filter.active:
            totals = queries.status_counts(connection, now=now)
            return [
                # Each status's own "<status>_estimated" flag where the counts carry one (done always does).
                StatusCount(
                    status=cast(Status, status),
                    count=getattr(totals, status),
                    at_least=False,
                    estimated=getattr(totals, f"{status}_estimated", False),
                )
                for status in STATUS_VALUES
            ]
        counts = []
        for status in STATUS_VALUES:
            count = queries.count_matching(connection, status=status, row_filter=row_filter, cap=FILTERED_COUNT_CAP)
            counts.append(
                StatusCount(
                    status=cast(Status, status),
                    count=min(count, FILTERED_COUNT_CAP),
                    at_least=count > FILTERED_COUNT_CAP,
                    estimated=False,
                )
            )
        return counts

    def find(self, query: str, *, outbox_name: str | None = None) -> list[FoundRow]:
        """Rows whose id or idempotency key is ``query``, in every outbox (or the one named).

        ``query`` is an id (ASCII digits) or a UUID; anything else raises
        ``InvalidSearch``.  Each outbox costs one unique-index probe.
        """
        text_query = query.strip()
        row_id = key = None
        if text_query.isascii() and text_query.isdigit() and len(text_query) <= 19:
            row_id = int(text_query)
            if not 1 <= row_id <= MAX_ROW_ID:
                return []  # a number no row id can have: nothing to find
        else:
            try:
                key = uuid.UUID(text_query) if text_query.isascii() else None
            except ValueError:
                key = None
            if key is None:
                raise InvalidSearch("search for a row id (a whole number) or an idempotency key (a UUID)")
        names = [outbox_name] if outbox_name is not None else self.outbox_names
        now = self.kit.clock.now()
        found = []
        with self.kit.operator_database.connect() as connection:
            for name in names:
                row = self._queries(name).find(connection, row_id=row_id, idempotency_key=key)
                if row is not None:
                    found.append(FoundRow(outbox=name, row=_summary(row, now)))
        return found

    def row(self, outbox_name: str, row_id: int) -> RowDetailModel:
        queries = self._queries(outbox_name)
        with self.kit.operator_database.connect() as connection:
            detail = queries.detail(connection, row_id, preview_chars=self.preview_chars)
            if detail is None:
                raise RowsNotFound(outbox_name, [row_id])
            history = row_attempts(connection, outbox_name, row_id)
        summary = _summary(detail.summary, self.kit.clock.now())
        return RowDetailModel(
            **summary.model_dump(),
            outbox=outbox_name,
            idempotency_key=detail.idempotency_key,
            claim_token=detail.claim_token,
            payload=[
                PayloadFieldModel(
                    name=field.name, type=field.type, text=field.text, length=field.length, truncated=field.truncated
                )
                for field in detail.payload
            ],
            attempt_history=[AttemptModel.model_validate(entry) for entry in history],
            ordering=self.ordered_keys.row_ordering(outbox_name, row_id),
        )

    def audit(self, *, outbox_name: str | None, cursor: str | None, limit: int) -> AuditPage:
        if outbox_name is not None:
            self.kit.outbox(outbox_name)
        statement = select(reset_audit).order_by(reset_audit.c.id.desc()).limit(limit + 1)
        if outbox_name is not None:
            statement = statement.where(reset_audit.c.outbox == outbox_name)
        if cursor:
            (after,) = decode_cursor(cursor, scope="audit", with_time=False)
            statement = statement.where(reset_audit.c.id < after)
        with self.kit.operator_database.connect() as connection:
            found = [AuditEntry.model_validate(dict(row._mapping)) for row in connection.execute(statement)]
        entries = found[:limit]
        next_cursor = encode_cursor("audit", (entries[-1].id,)) if len(found) > limit else None
        return AuditPage(entries=entries, next_cursor=next_cursor)

    def jobs(self) -> JobsView:
        """Every job with its schedule in words, last run, failure count and (drain jobs) pause."""
        return self.jobs_table.jobs()

    def job_runs(self, job_id: str, *, limit: int) -> JobRunsView:
        """One job's last ``limit`` runs, newest first."""
        return self.jobs_table.job_runs(job_id, limit=limit)

    # -- actions -------------------------------------------------------------

    def reset(self, outbox_name: str, ids: list[int], *, actor: str) -> ActionResult:
        """Reset the listed stuck rows (see the module's rules)."""
        return self._act(outbox_name, ids, action="reset", actor=actor)

    def retry_now(self, outbox_name: str, ids: list[int], *, actor: str) -> ActionResult:
        """Make the listed pending rows in backoff due now (see the module's rules)."""
        return self._act(outbox_name, ids, action="retry_now", actor=actor)

    def discard(self, outbox_name: str, ids: list[int], *, actor: str) -> ActionResult:
        """Discard the listed stuck rows: kept with the terminal status ``discarded``, never sent, out of the stuck
        count and its alert, until a person resets (or replays) them."""
        return self._act(outbox_name, ids, action="discard", actor=actor)

    def skip(self, outbox_name: str, ids: list[int], *, actor: str) -> ActionResult:
        """Skip the listed stuck rows in their keys' order: they stay stuck, the rows behind them flow
        (``outboxkit.operations.ordered_keys``)."""
        return self.ordered_keys.skip(outbox_name, ids, actor=actor)

    def _act(self, outbox_name: str, ids: list[int], *, action: str, actor: str) -> ActionResult:
        queries = self._queries(outbox_name)
        wanted = sorted(set(ids))
        with discard_migrations_checked(outbox_name), self.kit.operator_database.begin() as connection:
            states = queries.lock_row_states(connection, wanted)
            missing = [row_id for row_id in wanted if row_id not in states]
            if missing:
                raise RowsNotFound(outbox_name, missing)
            now = DatabaseTime(self.kit.clock).read(connection)  # held, and due now, by the server's clock
            held = [row_id for row_id, state in states.items() if state.held(now)]
            if held:
                raise RowsHeld(outbox_name, held)
            if action == "reset":
                marker = marker_parameters(outbox_name, actor, history=self.kit.settings.attempt_history_days > 0)
                changed = queries.reset_rows(connection, wanted, now=now, marker=marker)
            elif action == "discard":
                changed = queries.discard_rows(connection, wanted, now=now)
            else:
                changed = queries.retry_rows_now(connection, wanted, now=now)
            audit_id = self._record(connection, actor=actor, outbox_name=outbox_name, action=action, ids=changed, row_filter={})
            self._wake_drain(connection, outbox_name, changed)  # a discarded head of an ordered key frees the rows behind
        done = set(changed)
        skipped = [
            SkippedRow(id=row_id, reason=_skip_reason(action, states[row_id], now)) for row_id in wanted if row_id not in done
        ]
        return ActionResult(
            action=cast(ActionName, action),
            outbox=outbox_name,
            changed=len(changed),
            changed_ids=changed,
            skipped=skipped,
            audit_id=audit_id,
        )

    def reset_matching(
        self,
        outbox_name: str,
        row_filter: RowFilter,
        *,
        dry_run: bool,
        actor: str,
        max_seconds: float | None = REQUEST_SECONDS,
        discard: bool = False,
    ) -> MatchOutcome:
        """Count (dry run, capped) or reset (``discard``: discard) every stuck row that matches ``row_filter``, in
        bounded batches.

        See ``outboxkit.operations.bulk_reset``: a run stops after ``max_seconds``
        (``None``: at the end) and says so with ``complete: false``; run it again for the rest.
        """
        return self.bulk_reset.run(
            outbox_name, row_filter, dry_run=dry_run, actor=actor, max_seconds=max_seconds, discard=discard
        )

    def _wake_drain(self, connection: Connection, outbox_name: str, changed: list[int]) -> None:
        if changed:
            connection.execute(notify_statement(self.kit.outbox(outbox_name)))

    @staticmethod
    def _record(
        connection: Connection, *, actor: str, outbox_name: str, action: str, ids: list[int], row_filter: dict[str, Any]
    ) -> int | None:
        if not ids:
            return None
        return record_audit(connection, actor=actor, outbox_name=outbox_name, action=action, ids=ids, row_filter=row_filter)


def _summary(row: RowSummary, now: datetime) -> RowSummaryModel:
    state = RowState(id=row.id, status=row.status, next_attempt_at=row.next_attempt_at, claimed_until=row.claimed_until)
    return RowSummaryModel(
        id=row.id,
        status=cast(Status, row.status),
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        last_error_truncated=bool(row.last_error is not None and (row.last_error_length or 0) > len(row.last_error)),
        created_at=row.created_at,
        updated_at=row.updated_at,
        delivered_at=row.delivered_at,
        claimed_until=row.claimed_until,
        held=state.held(now),
        in_backoff=state.in_backoff(now),
    )


def _skip_reason(action: str, state: RowState, now: datetime) -> str:
    if state.status == "done":
        return "delivered; a reset does not send it again (a replay does)"
    if action == "reset":
        return "already pending" if state.status == "pending" else f"status is {state.status}"
    if action == "discard":
        return "already discarded" if state.status == "discarded" else f"status is {state.status}; only stuck rows are discarded"
    if state.status == "stuck":
        return "stuck; reset it instead"
    return "already due"
