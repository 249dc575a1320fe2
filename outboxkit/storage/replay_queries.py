"""The replay's statements: send delivered rows again (``outboxkit.operations.replay`` runs them).

A replay takes ``done`` rows that match an operator's filter
(``outboxkit.storage.row_filter``) and makes them ``pending`` and due now, one
bounded batch per statement, walking the table in id order so that each
row is replayed at most once per replay even if it is delivered again (and
matches again) before the walk ends.

Only ``done`` rows are touched.  A drain never holds a ``done`` row (the
claim takes pending rows only and the outcome write clears the lease), and
the UPDATE re-checks ``status = 'done'`` under the row lock, so a row that
is pending or in flight is never written here: a replay cannot make a row
be sent twice at once.  The rows are locked in id order (``FOR UPDATE``,
waiting rather than skipping, so a row another statement holds briefly is
not silently passed over), so two replays at once queue instead of
deadlocking.  Filters are bind parameters; the fragments are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from outboxkit.model import Outbox
from outboxkit.storage.operator_queries import AdminQueries, admin_queries_for
from outboxkit.storage.per_outbox import PerOutbox
from outboxkit.storage.reset_markers import MARKERS, marker_parameters
from outboxkit.storage.row_filter import RowFilter

__all__ = ["ReplayQueries", "ReplayedBatch", "replay_queries_for"]

# A replayed row starts a new delivery: pending, due now, no attempts made
# (the whole retry budget again), no lease, no delivery time.  It keeps its
# idempotency key, its last status code and error, and its payload.  Each row replayed gets a marker in its
# attempt history (outboxkit.storage.reset_markers), so its attempts count on.
REPLAY_BATCH = """
WITH target AS (
    SELECT id, attempts FROM {table}
    WHERE status = 'done' AND id > :after_id{filter}
    ORDER BY id
    LIMIT :limit
    FOR UPDATE
), changed AS (
    UPDATE {table} AS outbox
    SET status = 'pending',
        attempts = 0,
        next_attempt_at = :now,
        delivered_at = NULL,
        claimed_until = NULL,
        claim_token = NULL,
        updated_at = :now
    FROM target
    WHERE outbox.id = target.id AND outbox.status = 'done'
    RETURNING outbox.id, target.attempts AS attempts_before
), {markers}
SELECT (SELECT max(id) FROM target) AS last_id,
       (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM changed) AS ids
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayedBatch:
    """What one replay statement did: the ids made pending, and where the walk goes on (None: nothing left)."""

    ids: list[int]
    last_id: int | None


class ReplayQueries:
    """The replay's statements for one outbox class."""

    def __init__(self, outbox: type[Outbox]) -> None:
        self.admin: AdminQueries = admin_queries_for(outbox)

    def check(self, row_filter: RowFilter) -> None:
        """Refuse a filter this outbox cannot apply (an unknown payload column) before anything runs."""
        self.admin.filter_clauses(row_filter)

    def count(self, connection: Connection, row_filter: RowFilter, *, cap: int) -> int:
        """Delivered rows matching the filter, counted up to ``cap + 1``."""
        return self.admin.count_matching(connection, status="done", row_filter=row_filter, cap=cap)

    def sample(self, connection: Connection, row_filter: RowFilter, *, size: int) -> list[int]:
        """The newest ``size`` ids of delivered rows matching the filter."""
        return [row.id for row in self.admin.page(connection, status="done", row_filter=row_filter, after=None, limit=size)]

    def replay_batch(
        self,
        connection: Connection,
        row_filter: RowFilter,
        *,
        after_id: int,
        limit: int,
        now: datetime,
        marker: dict[str, object] | None = None,
    ) -> ReplayedBatch:
        """Make up to ``limit`` matching ``done`` rows with ids above ``after_id`` pending and due at ``now``, each with
        a marker in its attempt history (``marker``: ``reset_markers.marker_parameters``; None writes none)."""
        filter_sql, params = self.admin.filter_clauses(row_filter)
        statement = text(REPLAY_BATCH.format(table=self.admin.table_name, filter=filter_sql, markers=MARKERS))
        marked = marker if marker is not None else marker_parameters("", "", history=False)
        parameters = {**params, "after_id": after_id, "limit": limit, "now": now, **marked}
        row = connection.execute(statement, parameters).one()
        return ReplayedBatch(ids=list(row.ids), last_id=row.last_id)


_COMPILED: PerOutbox[type[Outbox], ReplayQueries] = PerOutbox(ReplayQueries)


def replay_queries_for(outbox: type[Outbox]) -> ReplayQueries:
    """The replay statements for ``outbox``, built once per class."""
    return _COMPILED(outbox)
