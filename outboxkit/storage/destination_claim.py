"""The claim's decisions per destination, in SQL: which destinations may go, who probes, and a fair share of each batch.

Every outbox row carries its destination (``Outbox.destination``, decided at
insert) and each destination of an outbox may have a state row in
``outboxkit_destinations`` (``outboxkit.breaker`` holds its rules).  The claim
reads both in its one statement, so what it decides holds in every process at
once and nothing claimed has to be given back:

* **Blocked.**  A destination whose state is ``open``, ``half_open`` or
  ``disabled``, or that is slowed (``slowed_until`` in the future, a receiver's
  ``Retry-After``), has none of its rows claimed.  They keep their attempts and
  their due times; nothing marks them.
* **The probe.**  An ``open`` destination whose cool-down is over (or a
  ``half_open`` one whose probe's lease ended) lets exactly one row through:
  a conditional ``UPDATE`` of its state row in the same statement turns it
  ``half_open`` and names the row (``probe_row_id``).  Of any number of claims
  that find the cool-down over at once, the first to lock the state row wins;
  the others re-check its condition after the lock and find it ``half_open``.
  A probe is never sent inside a ``Retry-After``: a slowed destination is not
  probed until the slow-down ends.
* **A fair share.**  The unordered claim walks the destinations that have
  pending rows, one step of ``ix_<table>_destination_due`` each, from where
  the previous claim stopped (``KeyCursor``, as the ordered claim walks keys);
  each destination that may go offers its share of the batch (its oldest due
  rows, locked with ``SKIP LOCKED``), and the batch takes them in turns (every
  destination's first row, then every second...), oldest due first within a
  turn.  A backlog of one destination therefore never delays
  another's new row by more than one claim, and a blocked destination costs
  one step of the walk, not one per waiting row.  The walk stops once it has
  found ``limit`` destinations with due rows or has gone round them all.
  Rows whose destination could not be decided at insert (NULL) take their
  turns as one more destination, never blocked.

* **A cap on sends in flight, across processes.**  A *suspect* destination
  (no success yet, a failure run, or a send out longer than a second in any
  process) has at most ``OutboxOptions.destination_cap`` rows claimed at once,
  counted from the live claims in the database (``claimed_until`` in the
  future), unless it is the only destination with due rows: a receiver that
  hangs holds at most that many send threads of all the drainers together.

* **Rate limits.**  A rate-limited destination offers no more rows than
  the whole tokens of its bucket (``outboxkit_destination_rates``), taken
  in the same statement under the bucket row's lock (``_RATES``); rows
  over the rate are not claimed, and nothing is given back.

* **An operator's limits.**  A rate or a cap an operator set on one
  destination while the kit runs (``outboxkit_destination_limits``,
  ``outboxkit.destinations.limits``) is read by key in the same statement and
  replaces the outbox's own for that destination: the rate in the bucket's
  refill, the cap as a hard cap on its live claims at all times.  Every claim
  reads it, so a change holds from the next claim of every process.

A destination's state is read by its key (the table's primary key), only
for the destinations walked, so the claim's cost follows the destinations
with pending rows, never the number of states stored.
"""

from __future__ import annotations

__all__ = [
    "ALONE_WALKED_TO",
    "BLOCKED",
    "LIMITS",
    "OPERATOR_RATES",
    "PROBE_DUE",
    "alone_claim_sql",
    "blocked_wakeups_sql",
    "destination_claim_sql",
    "earliest_due_sql",
    "look_sql",
    "operator_room_sql",
    "probe_sql",
    "rates_sql",
    "room_sql",
    "token_due_sql",
]

STATES = "outboxkit_destinations"

# Of a state row ``state``: its rows may not be claimed now (open, half-open, disabled, or slowed).
BLOCKED = "(state.status <> 'healthy' OR state.slowed_until > :now)"
# Of a state row ``state``: one of its rows may go as the probe now (never inside a Retry-After).
PROBE_DUE = (
    "((state.status = 'open' AND state.next_probe_at <= :now OR state.status = 'half_open' AND state.probe_until <= :now)"
    " AND NOT COALESCE(state.slowed_until > :now, false))"
)

# The first destination after {current} with a pending row, or the first of all once past the last one.
_NEXT_DESTINATION = """COALESCE(
    (SELECT destination FROM {table} WHERE status = 'pending' AND destination > {current} ORDER BY destination LIMIT 1),
    (SELECT destination FROM {table} WHERE status = 'pending' AND destination IS NOT NULL ORDER BY destination LIMIT 1))"""

# The cap.  A destination is *suspect* when its state shows no success yet (or none stored), a failure run, or one of
# its sends, in any process, has been out longer than a second (a claim older than that still live: every claim of
# the outbox has the same lease, so its age is its lease end's distance from this claim's).  A suspect destination
# has at most :cap rows claimed at once across every process, counted from the live claims in the database; its room
# is what is left.  Without a breaker no state is stored, so a destination without one is suspect only while
# :unknown_suspect (the breaker is on) says so.  The cap protects the other destinations, so a destination that is
# alone in the walk is not capped.  A proven destination reads one range of the claimed index (its claims older
# than a second: none while its sends are quick), never all its live claims.
SUSPECT_STATE = "(state.last_success_at IS NULL OR state.consecutive_failures > 0)"
_SLOW = """EXISTS (SELECT FROM {table} WHERE claimed_until > :now
        AND claimed_until < CAST(:lease_until AS timestamptz) - interval '1 second'
        AND status = 'pending' AND destination = {current})"""
_LIVE = "(SELECT count(*) FROM {table} WHERE claimed_until > :now AND status = 'pending' AND destination = {current})"
_ROOM = "COALESCE({operator_room}, CASE WHEN {suspect} OR {slow} THEN greatest(0, :cap - {live}) ELSE :limit END)"

# An operator's limits of the destination {current} (``outboxkit.destinations.limits``), read by key: NULL without
# one.  An operator's cap replaces the rule above for its destination and holds at all times (suspect or proven,
# alone in the walk or not): its room is the cap less its live claims, counted only when it has a cap.
LIMITS = "outboxkit_destination_limits"
_OPERATOR_ROOM = """(SELECT CASE WHEN operator.cap IS NOT NULL THEN greatest(0, operator.cap - {live}) END
        FROM {limits} AS operator WHERE operator.outbox = :outbox AND operator.destination = {current})"""

# One walk step's view of the destination {current}: its state (by key) and whether it has a due row.
_LOOK = """CROSS JOIN LATERAL (
        SELECT COALESCE({blocked}, false) AS blocked, COALESCE({probe_due}, false) AS probe_due,
               COALESCE({suspect}, CAST(:unknown_suspect AS boolean)) AS suspect,
               COALESCE((SELECT next_attempt_at <= :now FROM {table} WHERE status = 'pending' AND destination = {current}
                         ORDER BY destination, next_attempt_at, id LIMIT 1), false)
               AND NOT COALESCE({blocked}, false) AS may_go
        FROM (SELECT) AS one LEFT JOIN {states} AS state ON state.outbox = :outbox AND state.destination = {current}
    ) AS look"""

# The walk: one step per destination with pending rows, from where the previous claim stopped (the seed, step 0,
# stands for that place); the next destination is one probe of the destination index, fenced (OFFSET 0) so that it
# runs once per step.  It stops once it has found :limit destinations that may go, back at the one it started from,
# or after :steps steps.
_WALK = """
WITH RECURSIVE walk(destination, probe_due, suspect, may_go, start_destination, found, step) AS (
    SELECT CAST(:after AS varchar), false, false, false, CAST(NULL AS varchar), 0, 0
  UNION ALL
    SELECT next.destination, look.probe_due, look.suspect, look.may_go, COALESCE(walk.start_destination, next.destination),
           walk.found + CASE WHEN look.may_go THEN 1 ELSE 0 END, walk.step + 1
    FROM walk
    CROSS JOIN LATERAL (SELECT {next_destination} AS destination OFFSET 0) AS next
    {look}
    WHERE walk.found < :limit AND walk.step < :steps AND next.destination IS NOT NULL
      AND next.destination IS DISTINCT FROM walk.start_destination
)"""

# The probes: the destinations whose probe is due and have a due row ({pick}: (destination, id) pairs) turn
# half-open by a conditional UPDATE of their state row (re-checked after the row lock, so of concurrent claims one
# wins), which names the first probe; the winner sends up to :probes of the destination's oldest due rows
# ({probe_rows}; ``BreakerOptions.probes``), and every other claim finds the destination half-open until they end.
_PROBES = """, opened_probes AS (
    UPDATE {states} AS state
    SET status = 'half_open', probe_row_id = pick.id, probe_until = :lease_until, updated_at = :now
    FROM ({pick}) AS pick
    WHERE state.outbox = :outbox AND state.destination = pick.destination AND pick.id IS NOT NULL AND {probe_due}
    RETURNING state.destination, pick.id
), probes AS ({probe_rows})"""

# The unordered claim's probes: each walked destination's oldest due rows.
_UNORDERED_PICK = """SELECT walk.destination, (
            SELECT id FROM {table} WHERE status = 'pending' AND destination = walk.destination
            AND next_attempt_at <= :now ORDER BY destination, next_attempt_at, id LIMIT 1) AS id
        FROM walk WHERE walk.probe_due"""
_UNORDERED_PROBE_ROWS = """SELECT rows.id FROM opened_probes CROSS JOIN LATERAL (
        SELECT id FROM {table} WHERE status = 'pending' AND destination = opened_probes.destination
        AND next_attempt_at <= :now ORDER BY destination, next_attempt_at, id LIMIT :probes) AS rows"""

# Each destination that may go offers its share of the batch (under its room when it is suspect and not alone),
# oldest due first, locked with SKIP LOCKED (so concurrent claims take disjoint rows: a row another claim holds is
# passed over, not waited for); undecided rows (NULL) offer theirs as one more destination.  The batch takes them
# in turns, and the rows it leaves are free again when the claim commits.
_TURNS = """, shares AS (
    SELECT max(found) AS found, ceil(CAST(:limit AS numeric) / greatest(1, max(found)))::int AS rows FROM walk
), wants AS MATERIALIZED (
    SELECT walk.destination,
           CASE WHEN shares.found > 1 THEN least(shares.rows, {room}) ELSE COALESCE({operator_room}, :limit) END AS take
    FROM walk CROSS JOIN shares WHERE walk.may_go
){rates}, turns AS (
    SELECT pick.id, pick.next_attempt_at, pick.claim_token, wants.destination,
           row_number() OVER (PARTITION BY wants.destination ORDER BY pick.next_attempt_at, pick.id) AS turn
    FROM wants LEFT JOIN grants ON grants.destination = wants.destination CROSS JOIN LATERAL (
        SELECT id, next_attempt_at, claim_token FROM {table}
        WHERE status = 'pending' AND destination = wants.destination AND next_attempt_at <= :now
        ORDER BY destination, next_attempt_at, id
        LIMIT least(wants.take, COALESCE(grants.granted, wants.take))
        FOR UPDATE SKIP LOCKED) AS pick
  UNION ALL
    SELECT id, next_attempt_at, claim_token, NULL, row_number() OVER (ORDER BY next_attempt_at, id) FROM (
        SELECT id, next_attempt_at, claim_token FROM {table}
        WHERE status = 'pending' AND destination IS NULL AND next_attempt_at <= :now
        ORDER BY destination, next_attempt_at, id LIMIT :limit
        FOR UPDATE SKIP LOCKED) AS undecided
), candidates AS (
    SELECT id, next_attempt_at, claim_token IS NOT NULL AS orphaned FROM turns
    ORDER BY turn, next_attempt_at, id
    LIMIT :limit
)"""

# Where the walk stopped: the next claim starts after it; and the destination it found alone, if it visited one only
# (the next claim tries ``ALONE_CLAIM`` for it first).
WALKED_TO = """(SELECT destination FROM walk WHERE step > 0 ORDER BY step DESC LIMIT 1)::text AS outboxkit_walked_to,
    (SELECT destination FROM walk WHERE step = 1 AND NOT EXISTS (SELECT FROM walk AS more WHERE more.step = 2)
     AND NOT EXISTS (SELECT FROM turns WHERE turns.destination IS NULL))::text AS outboxkit_alone"""

# The common case, cheap: the destination :alone (found alone by the previous claim) is still the only one with
# pending rows (two probes of the destination index, one per end), no undecided row is pending, and its state does
# not block it (so it has no probe due either).  Then its due rows are claimed as the walk would claim them (a
# destination alone is not capped unless an operator capped it: one with an operator's limits takes the walk), by a
# statement a fraction of the walk's size to plan.  Otherwise the statement
# claims nothing and the caller runs the walk.
_ALONE_CANDIDATES = """
WITH alone AS (
    SELECT CAST(:alone AS varchar) AS destination
    WHERE (SELECT destination FROM {table} WHERE status = 'pending' AND destination IS NOT NULL
           ORDER BY destination LIMIT 1) = :alone
      AND (SELECT destination FROM {table} WHERE status = 'pending' AND destination IS NOT NULL
           ORDER BY destination DESC LIMIT 1) = :alone
      AND NOT EXISTS (SELECT FROM {table} WHERE status = 'pending' AND destination IS NULL)
      AND NOT EXISTS (SELECT FROM {states} AS state WHERE state.outbox = :outbox AND state.destination = :alone AND {blocked})
      AND NOT EXISTS (SELECT FROM {limits} AS operator WHERE operator.outbox = :outbox AND operator.destination = :alone)
), probes AS (
    SELECT CAST(NULL AS bigint) AS id WHERE false
), candidates AS (
    SELECT id, next_attempt_at, claim_token IS NOT NULL AS orphaned FROM {table}
    WHERE status = 'pending' AND destination = (SELECT destination FROM alone) AND next_attempt_at <= :now
    ORDER BY destination, next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)"""
ALONE_WALKED_TO = "CAST(:after AS text) AS outboxkit_walked_to, CAST(:alone AS text) AS outboxkit_alone"


# Rate limits (``OutboxOptions.rate_limit``, ``outboxkit.rate_limits``), in the claim too.  A destination's limit in
# requests per second, or NULL: an operator's (``outboxkit.destinations.limits``), its own from code and settings
# (:rate_names, :rate_values) or the outbox's for every destination (:rate_default).
_PER_SECOND = """COALESCE(
        (SELECT operator.per_second FROM outboxkit_destination_limits AS operator
         WHERE operator.outbox = :outbox AND operator.destination = {current}),
        (SELECT named.per_second FROM unnest(CAST(:rate_names AS text[]), CAST(:rate_values AS float8[]))
             AS named(destination, per_second) WHERE named.destination = {current}),
        CAST(:rate_default AS float8))"""

# Each rate-limited destination that would offer rows ({wants}: destination, take; {wanted}: how many of its due rows
# it would offer) takes its tokens from its bucket in ``outboxkit_destination_rates`` here, in the claim: the bucket
# row is locked (in destination order), so concurrent claims in any process take turns and see each other's spending;
# it refills at per_second up to its burst, and the destination offers no more rows than it has whole tokens
# (``grants``).  A destination seen for the first time gets a full bucket, created here; a claim that lost the race to
# create it takes none this time.  Rows over the rate are simply not claimed: their attempts and due times are
# untouched, and the earliest-due read wakes the loop when the next token comes.
_RATES = """, rate_wants AS MATERIALIZED (
    SELECT wants.destination, limits.per_second, greatest(1, limits.per_second * :burst_seconds) AS burst,
           {wanted} AS wanted
    FROM ({wants}) AS wants CROSS JOIN LATERAL (SELECT {per_second} AS per_second) AS limits
    WHERE limits.per_second IS NOT NULL
), buckets AS MATERIALIZED (
    SELECT rate.destination, rate.tokens, rate.refilled_at FROM {rates} AS rate
    WHERE rate.outbox = :outbox AND rate.destination IN (SELECT destination FROM rate_wants WHERE wanted > 0)
    ORDER BY rate.destination FOR UPDATE
), new_buckets AS (
    INSERT INTO {rates} AS rate (outbox, destination, tokens, refilled_at, updated_at)
    SELECT :outbox, destination, burst - least(wanted, floor(burst + 1e-9)), :now, :now FROM rate_wants
    WHERE wanted > 0 AND destination NOT IN (SELECT destination FROM buckets)
    ON CONFLICT DO NOTHING RETURNING rate.destination
), grants AS MATERIALIZED (
    SELECT rate_wants.destination, buckets.destination IS NOT NULL AS stored, refill.tokens,
           least(rate_wants.wanted, floor(refill.tokens + 1e-9))::int AS granted
    FROM rate_wants LEFT JOIN buckets ON buckets.destination = rate_wants.destination
    CROSS JOIN LATERAL (SELECT CASE
        WHEN buckets.destination IS NOT NULL THEN least(rate_wants.burst, buckets.tokens + rate_wants.per_second
             * greatest(0, extract(epoch FROM CAST(:now AS timestamptz) - buckets.refilled_at)))
        WHEN rate_wants.destination IN (SELECT destination FROM new_buckets) THEN rate_wants.burst
        ELSE 0 END AS tokens) AS refill
), spent AS (
    UPDATE {rates} AS rate SET tokens = grants.tokens - grants.granted, refilled_at = greatest(rate.refilled_at, :now),
        updated_at = :now
    FROM grants WHERE rate.outbox = :outbox AND rate.destination = grants.destination AND grants.stored
      AND grants.granted > 0
)"""
RATES = "outboxkit_destination_rates"

# When a rate-limited destination {current} has its next whole token (NULL: it has one now, or no limit).
_TOKEN_DUE = """(SELECT rate.refilled_at + (1 - rate.tokens) / limits.per_second * interval '1 second'
        FROM {rates} AS rate CROSS JOIN LATERAL (SELECT {per_second} AS per_second) AS limits
        WHERE rate.outbox = :outbox AND rate.destination = {current} AND rate.tokens < 1 - 1e-9
          AND limits.per_second IS NOT NULL)"""


# An outbox without a rate limit runs a claim without them: no destination has tokens to count, but a destination an
# operator gave a rate (one PK read per destination offering rows) offers none, so this claim never exceeds it; the
# earliest-due read says the outbox has such rates (OPERATOR_RATES), and its next claims take their tokens.
_NO_RATES = """, grants AS (SELECT wants.destination, 0 AS granted FROM ({wants}) AS wants
    WHERE EXISTS (SELECT FROM outboxkit_destination_limits AS operator
                  WHERE operator.outbox = :outbox AND operator.destination = wants.destination
                    AND operator.per_second IS NOT NULL))"""
# Whether any destination of the outbox has a rate an operator set (the earliest-due read's second column).
OPERATOR_RATES = """EXISTS (SELECT FROM outboxkit_destination_limits AS operator
        WHERE operator.outbox = :outbox AND operator.per_second IS NOT NULL)"""


def rates_sql(wants: str, wanted: str, *, rate_limits: bool = True) -> str:
    """The rate limits' CTEs (``grants``: destination, granted) for the destinations ``wants`` offers (without
    ``rate_limits``: none, but those an operator gave a rate offer nothing)."""
    if not rate_limits:
        return _NO_RATES.format(wants=wants)
    return _RATES.format(wants=wants, wanted=wanted, per_second=_PER_SECOND.format(current="wants.destination"), rates=RATES)


def token_due_sql(current: str) -> str:
    """When the destination ``current`` has its next rate-limit token (``_TOKEN_DUE``)."""
    return _TOKEN_DUE.format(rates=RATES, current=current, per_second=_PER_SECOND.format(current=current))


def alone_claim_sql(table: str) -> str:
    """``_ALONE_CANDIDATES`` for a quoted table (parameters: now, limit, outbox, alone)."""
    return _ALONE_CANDIDATES.format(table=table, states=STATES, blocked=BLOCKED, limits=LIMITS)


def look_sql(table: str, current: str) -> str:
    """``_LOOK`` of the destination ``current`` (a lateral join named ``look``)."""
    return _LOOK.format(
        blocked=BLOCKED, probe_due=PROBE_DUE, suspect=SUSPECT_STATE, states=STATES, table=table, current=current
    )


def room_sql(table: str, current: str, suspect: str) -> str:
    """How many more rows of the destination ``current`` may be claimed now (``_ROOM``); ``suspect`` says whether
    its state makes it suspect."""
    return _ROOM.format(
        suspect=suspect, slow=_SLOW.format(table=table, current=current), live=_LIVE.format(table=table, current=current),
        operator_room=operator_room_sql(table, current),
    )


def operator_room_sql(table: str, current: str) -> str:
    """How many more rows of the destination ``current`` its operator's cap lets a claim take now (NULL: no cap)."""
    return _OPERATOR_ROOM.format(limits=LIMITS, live=_LIVE.format(table=table, current=current), current=current)


def probe_sql(pick: str, probe_rows: str) -> str:
    """The probes' CTEs (``probes``: the ids of the rows that go as probes); ``pick`` gives (destination, id) pairs,
    ``probe_rows`` the rows sent for the destinations ``opened_probes`` turned half-open."""
    return _PROBES.format(states=STATES, probe_due=PROBE_DUE, pick=pick, probe_rows=probe_rows)


def destination_claim_sql(table: str, *, rate_limits: bool = True) -> str:
    """The unordered claim's first half: the walk, the probes and the candidates it locks (``walk``, ``probes``,
    ``candidates``; ``storage.drain_queries`` adds the rest).  Parameters: now, lease_until, limit, steps, outbox,
    after, cap, unknown_suspect, probes."""
    walk = _WALK.format(
        next_destination=_NEXT_DESTINATION.format(table=table, current="walk.destination"),
        look=look_sql(table, "next.destination"),
    )
    probes = probe_sql(_UNORDERED_PICK.format(table=table), _UNORDERED_PROBE_ROWS.format(table=table))
    rates = rates_sql("SELECT destination, take FROM wants", _WANTED.format(table=table), rate_limits=rate_limits)
    return walk + probes + _TURNS.format(
        table=table, room=room_sql(table, "walk.destination", "walk.suspect"), rates=rates,
        operator_room=operator_room_sql(table, "walk.destination"),
    )


# How many due rows of a rate-limited destination the unordered claim would offer (at most its share).
_WANTED = """(SELECT count(*) FROM (SELECT FROM {table} WHERE status = 'pending' AND destination = wants.destination
                AND next_attempt_at <= :now ORDER BY destination, next_attempt_at, id LIMIT wants.take) AS due)::int"""


# The earliest time a claim could take a row: each destination's oldest pending row (a row in flight counts with its
# lease end), or for a blocked one the end of what blocks it (the probe's time, the slow-down's end; never, while
# disabled), whichever is later; undecided rows by their own due time.  One step per destination with pending rows.
EARLIEST_DUE = """
WITH RECURSIVE walk(destination) AS (
    (SELECT destination FROM {table} WHERE status = 'pending' AND destination IS NOT NULL ORDER BY destination LIMIT 1)
  UNION ALL
    SELECT (SELECT destination FROM {table} WHERE status = 'pending' AND destination > walk.destination
            ORDER BY destination LIMIT 1)
    FROM walk WHERE walk.destination IS NOT NULL
)
SELECT min(due), {operator_rates} FROM (
    (SELECT next_attempt_at AS due FROM {table} WHERE status = 'pending' AND destination IS NULL
     ORDER BY destination, next_attempt_at, id LIMIT 1)
  UNION ALL
    SELECT CASE
        WHEN state.status = 'disabled' THEN NULL
        WHEN state.status = 'open' THEN greatest(first.next_attempt_at, state.next_probe_at, state.slowed_until)
        WHEN state.status = 'half_open' THEN greatest(first.next_attempt_at, state.probe_until, state.slowed_until)
        ELSE greatest(first.next_attempt_at, state.slowed_until, {token_due})
    END
    FROM walk
    CROSS JOIN LATERAL (
        SELECT next_attempt_at FROM {table} WHERE status = 'pending' AND destination = walk.destination
        ORDER BY destination, next_attempt_at, id LIMIT 1) AS first
    LEFT JOIN {states} AS state ON state.outbox = :outbox AND state.destination = walk.destination
    WHERE walk.destination IS NOT NULL
) AS dues
"""


# For a claim whose candidates do not walk destinations (the ordered claim): when each blocked destination with
# pending rows may go again (its probe, the end of its slow-down; never while disabled), read on the states' partial
# index of those not healthy or slowed.
_BLOCKED_WAKEUPS = """SELECT CASE
        WHEN state.status = 'disabled' THEN NULL
        WHEN state.status = 'open' THEN greatest(first.next_attempt_at, state.next_probe_at, state.slowed_until)
        WHEN state.status = 'half_open' THEN greatest(first.next_attempt_at, state.probe_until, state.slowed_until)
        ELSE greatest(first.next_attempt_at, state.slowed_until)
    END
    FROM {states} AS state
    CROSS JOIN LATERAL (
        SELECT next_attempt_at FROM {table} WHERE status = 'pending' AND destination = state.destination
        ORDER BY destination, next_attempt_at, id LIMIT 1) AS first
    WHERE state.outbox = :outbox AND (state.status <> 'healthy' OR state.slowed_until IS NOT NULL)"""


def blocked_wakeups_sql(table: str) -> str:
    """When each blocked destination with pending rows may go again (one due time per row; parameter: outbox)."""
    return _BLOCKED_WAKEUPS.format(states=STATES, table=table)


def earliest_due_sql(table: str) -> str:
    """``EARLIEST_DUE`` for a quoted table (parameter: outbox); its second column is ``OPERATOR_RATES``."""
    return EARLIEST_DUE.format(
        table=table, states=STATES, token_due=token_due_sql("walk.destination"), operator_rates=OPERATOR_RATES
    )
