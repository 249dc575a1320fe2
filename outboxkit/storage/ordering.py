"""Ordered delivery by key: the statements of an outbox that declares ``OutboxOptions.ordering_key``.

Rows sharing a key are delivered one at a time, in ``id`` order: a row is
claimable only when it is its key's *head*, the first row of the key (by
``id``) that is not ``done`` and not skipped by a person.  So a row in flight
or in backoff holds the rows behind it (they are not due until it is
``done``), and a ``stuck`` head blocks its key until an operator retries it
(reset, retry now) or skips it.  A skipped row stays ``stuck`` and is never
deleted; it is listed in ``outboxkit_ordering_skips`` and no longer counts in
its key's order (reset later, it is delivered again as its key's head, if it
is the first row left).  Rows whose key is NULL are unordered and are claimed
from their own due index, as an outbox without a key claims.

The claim does not read the rows waiting behind a head.  It walks the keys
that have undelivered rows, in key order, on the index ``(key, id) WHERE
status <> 'done'``: for each key one step finds the next key and one reads
its head; it stops once it has a batch of claimable heads (pending and due),
or has gone round every key.  The next claim starts after the last key this
one visited, so keys are served in turn: a key with a long backlog gets one
row per round, like a key with one row, and a key that is blocked (its head in
flight, in backoff or stuck) costs one step, not one per waiting row.  A
claim's cost grows with the keys it steps over before it has a batch, never
with the rows waiting behind heads.  The heads and the due unkeyed rows then
compete oldest due first for the batch, and are locked with ``FOR UPDATE SKIP
LOCKED`` as the unordered claim locks, so concurrent claims stay disjoint: a
head another drain is claiming is skipped, and one claimed and committed
meanwhile no longer passes the re-check (it is no longer due).

A head is claimable only while no row of its key is claimed: a row made
pending again before the row in flight (a replayed delivered row, a reset
skipped row) waits until that row is recorded, so a key never has two rows
in flight.

Order is ``id`` order among committed rows.  Two transactions that insert
rows of one key at once may commit in the other order than their ids; if the
later id is claimed before the earlier one commits, it is delivered first.
An application that inserts rows of one key from concurrent transactions
serializes them (e.g. by locking the entity the key names before the insert).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from outboxkit.storage.destination_claim import (
    BLOCKED,
    OPERATOR_RATES,
    PROBE_DUE,
    STATES,
    SUSPECT_STATE,
    blocked_wakeups_sql,
    operator_room_sql,
    probe_sql,
    rates_sql,
    room_sql,
    token_due_sql,
)
from outboxkit.storage.tables import ordering_skips

__all__ = ["BACKLOG_KEY_LIMIT", "DUE_KEY_LIMIT", "KeyCursor", "OrderedStatements", "ordered_statements"]

SKIPS = ordering_skips.name

# A key's head: its first row that is not done (nor discarded by a person), passing over rows a person skipped
# while they are stuck.
_HEAD = """
    SELECT head.id, head.status, head.next_attempt_at, head.destination FROM {table} AS head
    WHERE head.{key} = {current} AND head.status NOT IN ('done', 'discarded')
      AND NOT (head.status = 'stuck' AND EXISTS (
          SELECT FROM {skips} AS skip WHERE skip.outbox = :outbox AND skip.row_id = head.id))
    ORDER BY head.id LIMIT 1
"""

# The first key after {current} with a row not done, or the first key of all once past the last one.
_NEXT_KEY = """COALESCE(
    (SELECT {key} FROM {table} WHERE {key} > {current} AND status <> 'done' ORDER BY {key} LIMIT 1),
    (SELECT {key} FROM {table} WHERE {key} IS NOT NULL AND status <> 'done' ORDER BY {key} LIMIT 1))"""

# The walk: one row per key visited, with its head, whether the head is claimable, and how many
# claimable heads were found so far; it stops at :limit of them, or back at the key it started from.
ORDERED_CANDIDATES = """
WITH RECURSIVE walk(key, head_id, claimable, wrapped, start_key, found, step) AS (
    SELECT start.key, head.id, COALESCE(head.claimable, false), false, start.key,
           CASE WHEN head.claimable THEN 1 ELSE 0 END, 1
    FROM (SELECT {first_key} AS key) AS start
    LEFT JOIN LATERAL (SELECT id, status = 'pending' AND next_attempt_at <= :now AND {may_go} AND {start_free} AS claimable
                       FROM ({head_of_start}) AS h) AS head ON true
    WHERE start.key IS NOT NULL
  UNION ALL
    SELECT next.key, head.id, COALESCE(head.claimable, false), next.wrapped, walk.start_key,
           walk.found + CASE WHEN head.claimable THEN 1 ELSE 0 END, walk.step + 1
    FROM walk
    CROSS JOIN LATERAL (
        SELECT candidate.key, walk.wrapped OR candidate.key <= walk.key AS wrapped
        FROM (SELECT {next_key} AS key) AS candidate
    ) AS next
    LEFT JOIN LATERAL (SELECT id, status = 'pending' AND next_attempt_at <= :now AND {may_go} AND {next_free} AS claimable
                       FROM ({head_of_next}) AS h) AS head ON true
    WHERE walk.found < :limit AND next.key IS NOT NULL AND NOT (next.wrapped AND next.key >= walk.start_key)
), unkeyed AS (
    SELECT id FROM {table} AS h
    WHERE status = 'pending' AND next_attempt_at <= :now AND {key} IS NULL AND {may_go}
    ORDER BY next_attempt_at, id
    LIMIT :limit
){probes}, locked AS (
    SELECT id, next_attempt_at, claim_token IS NOT NULL AS orphaned, destination FROM {table}
    WHERE id IN (SELECT head_id FROM walk WHERE claimable UNION ALL SELECT id FROM unkeyed)
      AND status = 'pending' AND next_attempt_at <= :now
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), turns AS (
    SELECT locked.*, row_number() OVER (PARTITION BY destination ORDER BY next_attempt_at, id) AS turn,
           min(destination) OVER () <> max(destination) OVER () AS shared FROM locked
), capped AS (
    SELECT turns.* FROM turns
    LEFT JOIN {states} AS state ON state.outbox = :outbox AND state.destination = turns.destination
    WHERE turns.destination IS NULL
       OR (NOT turns.shared OR turns.turn <= {room}) AND turns.turn <= COALESCE({operator_room}, turns.turn)
){rates}, candidates AS (
    SELECT capped.id, capped.next_attempt_at, capped.orphaned FROM capped
    LEFT JOIN grants ON grants.destination = capped.destination
    WHERE grants.granted IS NULL OR capped.turn <= grants.granted
)"""
# The heads of each rate-limited destination the claim would take, for its tokens (outboxkit.storage.destination_claim).
_WANTS = "SELECT destination, count(*)::int AS take FROM capped WHERE destination IS NOT NULL GROUP BY destination"
# A head (or unkeyed row) ``h`` may go unless its destination is blocked (outboxkit.storage.destination_claim).
_MAY_GO = f"""NOT EXISTS (
        SELECT FROM {STATES} AS state WHERE state.outbox = :outbox AND state.destination = h.destination AND {BLOCKED})"""

# No row of the key {current} is claimed now: a row made pending again before a row in flight (a replayed
# delivered row, a reset skipped row) becomes its key's head, but is claimable only once that row is recorded (or
# its lease ends), so a key never has two rows in flight.  Read on the index of claimed rows.
_KEY_FREE = """NOT EXISTS (
        SELECT FROM {table} AS busy WHERE busy.claimed_until > :now AND busy.status = 'pending' AND busy.{key} = {current})"""

# The probe of each destination whose probe is due (read on its partial index of states not healthy): its oldest due
# row that is unkeyed or its key's head, among its first PROBE_SCAN due rows, so a probe never breaks a key's order.
PROBE_SCAN = 100
_ORDERED_PICK = """SELECT state.destination, (
            SELECT c.id FROM (
                SELECT id, {key} AS key, next_attempt_at FROM {table} WHERE status = 'pending'
                AND destination = state.destination AND next_attempt_at <= :now
                ORDER BY destination, next_attempt_at, id LIMIT {scan}) AS c
            WHERE c.key IS NULL OR (c.id = (SELECT h.id FROM ({head_of_c}) AS h) AND {c_free})
            ORDER BY c.next_attempt_at, c.id LIMIT 1) AS id
        FROM {states} AS state WHERE state.outbox = :outbox AND state.status <> 'healthy' AND {probe_due}"""

# The claim's second half (the orphan rule, the UPDATE) is the unordered claim's: outboxkit.storage.drain_queries adds it,
# returning as well where the walk stopped (WALKED_TO), where the next claim starts.
WALKED_TO = "(SELECT key FROM walk ORDER BY step DESC LIMIT 1)::text AS outboxkit_walked_to, NULL::text AS outboxkit_alone"

# The earliest due time of a row that a claim could take: an unkeyed pending row, or a key's head
# that is pending (a head in flight counts with its lease end).  Rows waiting behind a head are not
# due, whatever their next_attempt_at says: the background loop must not wake for them.  The walk is
# bounded like the backlog's: it visits the first DUE_KEY_LIMIT keys; past them, the keys not visited
# stand in with the oldest pending row of all, but never sooner than a second from now (a row waiting
# behind a head would otherwise wake the loop for nothing, again and again).
DUE_KEY_LIMIT = 32
EARLIEST_ORDERED_DUE = """
WITH RECURSIVE keys(key, step) AS (
    (SELECT {key}, 1 FROM {table} WHERE {key} IS NOT NULL AND status <> 'done' ORDER BY {key} LIMIT 1)
  UNION ALL
    SELECT (SELECT {key} FROM {table} WHERE {key} > keys.key AND status <> 'done' ORDER BY {key} LIMIT 1), keys.step + 1
    FROM keys WHERE keys.key IS NOT NULL AND keys.step <= {key_limit}
)
SELECT min(due), {operator_rates} FROM (
    (SELECT next_attempt_at AS due FROM {table} AS h WHERE status = 'pending' AND {key} IS NULL AND {may_go}
     ORDER BY next_attempt_at, id LIMIT 1)
  UNION ALL
    SELECT greatest(head.next_attempt_at, {token_due}) FROM keys CROSS JOIN LATERAL ({head_of_keys}) AS head
    WHERE keys.key IS NOT NULL AND keys.step <= {key_limit} AND head.status = 'pending' AND {keys_free} AND NOT EXISTS (
        SELECT FROM {states} AS state WHERE state.outbox = :outbox AND state.destination = head.destination AND {blocked})
  UNION ALL
    SELECT greatest(
        (SELECT next_attempt_at FROM {table} WHERE status = 'pending' ORDER BY next_attempt_at, id LIMIT 1),
        CAST(:now AS timestamptz) + interval '1 second')
    FROM keys WHERE keys.step = {key_limit} + 1 AND keys.key IS NOT NULL
  UNION ALL
    {blocked_wakeups}
) AS dues
"""


# -- the backlog as the overview, the metrics and the minute sample count it ----------------------

# At most this many keys are walked to count the backlog; past them, the rest is bounded, not counted.
BACKLOG_KEY_LIMIT = 1_000

# What is really due in an ordered outbox: the due unkeyed rows and the due pending heads.  The rows
# behind a head are held by order, whatever their next_attempt_at says, and are not counted as due.
# The walk visits the first :key_limit keys with undelivered rows (one step and one head read per key,
# as EARLIEST_ORDERED_DUE does), never the rows behind the heads.  Past :key_limit keys (more_keys),
# the keys not visited count no head, and their oldest due row, held or not, stands in for their oldest
# due head (beyond_oldest_due, looked for among the :cap oldest due rows): the lag is not understated
# for want of a walk, and the held count is an upper bound.
# Unkeyed rows are counted on ix_<table>_due_unkeyed, up to :cap; the due ones only :with_due (the
# overview's counts need the pending ones, "drain now" and the minute sample the due ones).
ORDERED_BACKLOG = """
WITH RECURSIVE keys(key, step) AS (
    (SELECT {key}, 1 FROM {table} WHERE {key} IS NOT NULL AND status <> 'done' ORDER BY {key} LIMIT 1)
  UNION ALL
    SELECT (SELECT {key} FROM {table} WHERE {key} > keys.key AND status <> 'done' ORDER BY {key} LIMIT 1), keys.step + 1
    FROM keys WHERE keys.key IS NOT NULL AND keys.step <= :key_limit
), heads AS (
    SELECT head.status, head.next_attempt_at FROM keys CROSS JOIN LATERAL ({head_of_keys}) AS head
    WHERE keys.key IS NOT NULL AND keys.step <= :key_limit
), last_visited AS (
    SELECT key FROM keys WHERE step = :key_limit
       AND EXISTS (SELECT FROM keys AS more WHERE more.step = :key_limit + 1 AND more.key IS NOT NULL)
)
SELECT
    (SELECT count(*) FROM heads) AS keys_visited,
    EXISTS (SELECT FROM last_visited) AS more_keys,
    (SELECT count(*) FROM heads WHERE status = 'pending') AS pending_heads,
    (SELECT count(*) FROM heads WHERE status = 'pending' AND next_attempt_at <= :now) AS due_heads,
    (SELECT min(next_attempt_at) FROM heads WHERE status = 'pending' AND next_attempt_at <= :now) AS oldest_due_head,
    (SELECT beyond.next_attempt_at FROM last_visited CROSS JOIN LATERAL (
         SELECT oldest.next_attempt_at FROM (
             SELECT next_attempt_at, id, {key} AS key FROM {table} WHERE status = 'pending' AND next_attempt_at <= :now
             ORDER BY next_attempt_at, id LIMIT :cap) AS oldest
         WHERE oldest.key > last_visited.key ORDER BY oldest.next_attempt_at, oldest.id LIMIT 1) AS beyond
    ) AS beyond_oldest_due,
    (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'pending' AND {key} IS NULL
                           ORDER BY next_attempt_at, id LIMIT :cap) AS capped) AS pending_unkeyed,
    CASE WHEN :with_due THEN
        (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE status = 'pending' AND {key} IS NULL AND next_attempt_at <= :now
                               ORDER BY next_attempt_at, id LIMIT :cap) AS capped)
    END AS due_unkeyed,
    (SELECT min(next_attempt_at) FROM {table}
     WHERE status = 'pending' AND {key} IS NULL AND next_attempt_at <= :now) AS oldest_due_unkeyed
"""

# -- the operator's statements (outboxkit.operations.ordered_keys) ------------------------------

# Rows behind a head are counted up to a cap, so a key with a huge backlog costs a bounded read.
WAITING_CAP = 10_000

# One row's place in its key's order: its key, whether a person skipped it, its key's head, and the rows
# behind it that are not done (counted up to WAITING_CAP + 1).
ROW_ORDERING = """
SELECT target.{key}::text AS key,
       EXISTS (SELECT FROM {skips} AS skip WHERE skip.outbox = :outbox AND skip.row_id = target.id) AS skipped,
       (SELECT h.id FROM ({head_of_row}) AS h) AS head_id,
       (SELECT count(*) FROM (
            SELECT FROM {table} AS behind
            WHERE behind.{key} = target.{key} AND behind.id > target.id AND behind.status <> 'done'
            LIMIT {cap_plus_one}) AS counted) AS waiting
FROM {table} AS target
WHERE target.id = :id
"""

# The stuck heads: each blocks its key.  Read from the stuck index, first :limit by id, with the rows behind each.
STUCK_HEADS = """
SELECT target.id, target.{key}::text AS key, target.attempts, target.last_status_code, target.last_error, target.updated_at,
       (SELECT count(*) FROM (
            SELECT FROM {table} AS behind
            WHERE behind.{key} = target.{key} AND behind.id > target.id AND behind.status <> 'done'
            LIMIT {cap_plus_one}) AS counted) AS waiting
FROM {table} AS target
WHERE target.status = 'stuck' AND target.{key} IS NOT NULL AND target.id > :after
  AND NOT EXISTS (SELECT FROM {skips} AS skip WHERE skip.outbox = :outbox AND skip.row_id = target.id)
  AND (SELECT h.id FROM ({head_of_row}) AS h) = target.id
ORDER BY target.id
LIMIT :limit
"""

# Rows that may be skipped: stuck, with a key, not skipped yet (locked, so a reset cannot race the skip).
SKIPPABLE_ROWS = """
SELECT target.id, target.status, target.{key} IS NOT NULL AS keyed,
       EXISTS (SELECT FROM {skips} AS skip WHERE skip.outbox = :outbox AND skip.row_id = target.id) AS skipped
FROM {table} AS target
WHERE target.id = ANY(:ids)
ORDER BY target.id
FOR UPDATE
"""

SKIP_ROWS = f"""
INSERT INTO {SKIPS} (outbox, row_id, skipped_by, skipped_at)
SELECT :outbox, id, :actor, :now FROM unnest(CAST(:ids AS bigint[])) AS id
ON CONFLICT DO NOTHING
RETURNING row_id
"""


@dataclass(slots=True)
class KeyCursor:
    """Where one drainer's next ordered claim starts its walk: after the last key the previous claim visited.

    ``after`` is the key as text (NULL: from the first key); it is cast back to the key's type in SQL.
    """

    after: str | None = None
    alone: str | None = None  # the destination the previous unordered claim found alone (storage.destination_claim)
    # Whether a destination of the outbox has a rate an operator set, as last read, and when (time.monotonic()):
    # the drainer's claims then take tokens (storage.drain_queries, OutboxQueries.claim_due_rows).
    operator_rates: bool = False
    operator_rates_read_at: float = -math.inf


@dataclass(frozen=True, slots=True)
class OrderedStatements:
    """The ordered claim and earliest-due statements of one outbox table (plain SQL, SQLAlchemy ``:name`` parameters)."""

    table: str  # quoted
    key: str  # the key column's quoted name
    key_type: str  # its SQL type, to cast the cursor back

    def candidates_sql(self, *, rate_limits: bool = True) -> str:
        """The ordered claim's first half: the walk and the candidates it locks (``storage.drain_queries`` adds the rest)."""
        after = f"CAST(:after AS {self.key_type})"
        first_key = _NEXT_KEY.format(key=self.key, table=self.table, current=after)
        # With no cursor, "the first key after NULL" is NULL and COALESCE falls back to the first key.
        pick = _ORDERED_PICK.format(
            key=self.key, table=self.table, scan=PROBE_SCAN, head_of_c=self._head("c.key"), states=STATES,
            probe_due=PROBE_DUE, c_free=self._key_free("c.key"),
        )
        return ORDERED_CANDIDATES.format(
            table=self.table,
            key=self.key,
            first_key=first_key,
            next_key=_NEXT_KEY.format(key=self.key, table=self.table, current="walk.key"),
            head_of_start=self._head("start.key"),
            head_of_next=self._head("next.key"),
            may_go=_MAY_GO,
            start_free=self._key_free("start.key"),
            next_free=self._key_free("next.key"),
            probes=probe_sql(pick, "SELECT id FROM opened_probes"),
            states=STATES,
            room=room_sql(self.table, "turns.destination", f"COALESCE({SUSPECT_STATE}, CAST(:unknown_suspect AS boolean))"),
            operator_room=operator_room_sql(self.table, "turns.destination"),
            rates=rates_sql(_WANTS, "wants.take", rate_limits=rate_limits),
        )

    def walked_to_column(self) -> str:
        return WALKED_TO

    def earliest_due_sql(self) -> str:
        return EARLIEST_ORDERED_DUE.format(
            table=self.table, key=self.key, head_of_keys=self._head("keys.key"), may_go=_MAY_GO, states=STATES,
            blocked=BLOCKED, blocked_wakeups=blocked_wakeups_sql(self.table), keys_free=self._key_free("keys.key"),
            key_limit=DUE_KEY_LIMIT, token_due=token_due_sql("head.destination"), operator_rates=OPERATOR_RATES,
        )

    def backlog_sql(self) -> str:
        """The due and held-by-order figures (``ORDERED_BACKLOG``; parameters now, outbox, key_limit, cap, with_due)."""
        return ORDERED_BACKLOG.format(table=self.table, key=self.key, head_of_keys=self._head("keys.key"))

    def row_ordering_sql(self) -> str:
        return self._operator(ROW_ORDERING)

    def skip_rows_sql(self) -> str:
        return SKIP_ROWS

    def stuck_heads_sql(self) -> str:
        return self._operator(STUCK_HEADS)

    def skippable_rows_sql(self) -> str:
        return self._operator(SKIPPABLE_ROWS)

    def _operator(self, statement: str) -> str:
        return statement.format(
            table=self.table, key=self.key, skips=SKIPS, head_of_row=self._head("target." + self.key),
            cap_plus_one=WAITING_CAP + 1,
        )

    def _key_free(self, current: str) -> str:
        return _KEY_FREE.format(table=self.table, key=self.key, current=current)

    def _head(self, current: str) -> str:
        return _HEAD.format(table=self.table, key=self.key, current=current, skips=SKIPS)


def ordered_statements(outbox: Any, table: str) -> OrderedStatements | None:
    """The ordered statements of an outbox class (None when it declares no ``ordering_key``)."""
    from sqlalchemy.dialects import postgresql

    key = outbox.__outbox__.ordering_key
    if key is None:
        return None
    column = outbox.__mapper__.attrs[key].columns[0]
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    quoted = str(dialect.identifier_preparer.quote(column.name))
    return OrderedStatements(table=table, key=quoted, key_type=str(column.type.compile(dialect=dialect)))
