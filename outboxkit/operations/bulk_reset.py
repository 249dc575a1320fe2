"""Reset every stuck row matching a filter: a capped count first, then bounded batches, each its own transaction.

A filter may match a hundred thousand rows; one transaction resetting them
all held their locks for seconds and ran past any sensible time limit.  So:

* the dry run (and the figure a real run reports as ``matched``) counts at
  most ``MATCH_COUNT_CAP + 1`` rows and says "at least" beyond;
* the reset walks the matching stuck rows in id order, ``batch_size`` at a
  time (``AdminQueries.reset_stuck_batch``).  Each batch is one short
  transaction of the operator's database: it resets its rows (skipping any
  row another transaction has locked, never waiting), records them in the
  audit and wakes the drain, and commits before the next batch starts, so
  each batch is bounded by the admin's time limit and the rows of a batch
  are either all reset and audited or not at all;
* a run stops after ``max_seconds`` (the admin's share of one request; the
  CLI passes ``None`` and runs to the end) or when a later batch meets the
  admin's time limit, and reports ``complete: false`` with what it did.  The
  rows it reset stay reset.  Running it again continues: only rows still
  stuck and matching are touched, so a repeat, or a run after an
  interruption, never resets a row twice nor skips one.

A discard by filter takes the same path (``discard=True``): the matching stuck rows
become ``discarded``, each batch audited as ``discard`` (and the drain woken: a discarded
head of an ordered key frees the rows behind it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy.exc import IntegrityError

from outboxkit.errors import MigrationRequired, OperatorPoolBusy, OperatorQueryTimeout
from outboxkit.kit import OutboxKit
from outboxkit.operations.controls import record_audit
from outboxkit.operations.schemas import MatchOutcome
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.notify import notify_statement
from outboxkit.storage.operator_queries import admin_queries_for
from outboxkit.storage.reset_markers import marker_parameters
from outboxkit.storage.row_filter import RowFilter

__all__ = ["BATCH_SIZE", "MATCH_COUNT_CAP", "REQUEST_SECONDS", "BulkReset", "discard_migrations_checked"]

BATCH_SIZE = 1_000
# The dry-run count stops here ("10,000+"), as the tabs' counts under a filter do.
MATCH_COUNT_CAP = 10_000
# How long one admin request keeps starting batches before it reports and stops.
REQUEST_SECONDS = 20.0
SAMPLE_SIZE = 20


@contextmanager
def discard_migrations_checked(outbox_name: str) -> Iterator[None]:
    """Around a discard's transaction: a table or an audit that cannot take it yet says which migration to run."""
    try:
        yield
    except IntegrityError as exc:
        refused = str(exc.orig)
        if "ck_outboxkit_attempts_outcome" in refused:
            raise MigrationRequired(
                "the attempt history cannot mark resets yet: run the kit's migration outboxkit_0019 (`alembic upgrade heads`)"
            ) from None
        if "ck_outboxkit_reset_audit_action" in refused:
            raise MigrationRequired(
                "the reset audit cannot record discards yet: run the kit's migration outboxkit_0016 (`alembic upgrade heads`)"
            ) from None
        if "_status" in refused and "check constraint" in refused:
            raise MigrationRequired(
                f"the table of outbox {outbox_name!r} does not take the status 'discarded' yet: add "
                "outboxkit.migrations.helpers.allow_discarded(<your outbox classes>) to a migration and run it "
                "(docs/operations.md, \"Upgrading to discarded rows\"); nothing was changed"
            ) from None
        raise


class BulkReset:
    """The filter reset of one kit (see the module docstring)."""

    def __init__(self, kit: OutboxKit, *, batch_size: int = BATCH_SIZE, timer: Callable[[], float] = time.monotonic) -> None:
        self.kit = kit
        self.batch_size = batch_size
        self.timer = timer  # seconds, for the run's time share (injectable, so tests need not wait)

    def run(
        self,
        outbox_name: str,
        row_filter: RowFilter,
        *,
        dry_run: bool,
        actor: str,
        max_seconds: float | None,
        discard: bool = False,
    ) -> MatchOutcome:
        """Count (dry run) or reset (``discard``: discard) the stuck rows of ``outbox_name`` that match ``row_filter``."""
        started = self.timer()
        queries = admin_queries_for(self.kit.outbox(outbox_name))  # UnknownOutboxError for a bad name
        database = self.kit.operator_database
        with database.connect() as connection:
            matched, sample = queries.count_stuck_matching(
                connection, row_filter, sample_size=SAMPLE_SIZE, cap=MATCH_COUNT_CAP
            )
        changed: list[int] = []
        audit_ids: list[int] = []
        batches, complete = 0, True
        while not dry_run:
            if max_seconds is not None and self.timer() - started >= max_seconds:
                complete = False
                break
            try:
                with discard_migrations_checked(outbox_name), database.begin() as connection:
                    batch = queries.reset_stuck_batch(
                        connection,
                        row_filter,
                        after_id=changed[-1] if changed else 0,
                        limit=self.batch_size,
                        now=DatabaseTime(self.kit.clock).read(connection),  # due now by the server's clock
                        discard=discard,
                        marker=marker_parameters(outbox_name, actor, history=self.kit.settings.attempt_history_days > 0),
                    )
                    if batch:
                        audit_ids.append(
                            record_audit(
                                connection,
                                actor=actor,
                                outbox_name=outbox_name,
                                action="discard" if discard else "reset",
                                ids=batch,
                                row_filter=row_filter.as_dict(),
                            )
                        )
                        connection.execute(notify_statement(self.kit.outbox(outbox_name)))
            except (OperatorQueryTimeout, OperatorPoolBusy):
                if not batches:
                    raise  # nothing done: the operator gets the refusal ("narrow the filter")
                complete = False
                break
            batches += 1
            changed += batch
            if len(batch) < self.batch_size:
                break
        return MatchOutcome(
            outbox=outbox_name,
            filter=row_filter,
            dry_run=dry_run,
            matched=min(matched, MATCH_COUNT_CAP),
            matched_at_least=matched > MATCH_COUNT_CAP,
            sample_ids=sample,
            changed=len(changed),
            batches=batches,
            complete=complete,
            audit_id=audit_ids[0] if audit_ids else None,
            audit_ids=audit_ids,
        )
