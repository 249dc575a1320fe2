"""Leases: the runs of scheduled Python jobs in progress, counted across every process.

A run of a schedule's Python job holds one row of
``outboxkit_schedule_leases`` from the claim that starts it until it has
recorded its outcome.  The row is taken in the claim's transaction, under
the schedule row's lock, after counting the schedule's live leases
(``expires_at`` in the future) against its ``max_running``; so the limit
holds across processes, not only inside one.

The holder renews ``expires_at`` while the run goes on (every third of the
lease).  A process that dies stops renewing: once the lease has expired,
any runner sweeps it (``take_expired``), marks the run ``abandoned`` and
frees the slot.  The schedule's ``rerun_if_abandoned`` then decides whether
the run is started once more (the lease's ``attempt`` is 2, and a second
abandonment is final).

What a lease cannot do: stop a live process that stopped renewing (a
stalled host, a paused VM) from finishing its run after the lease expired.
Such a run records its outcome over ``abandoned`` unless a re-run holds the
occurrence by then; size the lease well beyond the longest pause you expect.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, RowMapping, bindparam, text

__all__ = ["LeaseGrant", "count_live", "release", "renew", "take", "take_expired"]

_COUNT_LIVE = text(
    "SELECT count(*) FROM outboxkit_schedule_leases WHERE schedule_id = :schedule_id AND expires_at > :now"
)
_TAKE = text(
    """
    INSERT INTO outboxkit_schedule_leases
        (token, schedule_id, run_id, scheduled_for, holder, attempt, acquired_at, expires_at)
    VALUES (:token, :schedule_id, :run_id, :scheduled_for, :holder, :attempt, :now, :expires_at)
    """
)
_RENEW = text(
    "UPDATE outboxkit_schedule_leases SET expires_at = :expires_at WHERE token IN :tokens RETURNING token"
).bindparams(bindparam("tokens", expanding=True))
_RELEASE = text("DELETE FROM outboxkit_schedule_leases WHERE token = :token RETURNING token")
# Locks the lease and its schedule row; a schedule a claim holds is skipped and swept next time.
_TAKE_EXPIRED = text(
    """
    DELETE FROM outboxkit_schedule_leases AS lease
    WHERE lease.token IN (
        SELECT expired.token FROM outboxkit_schedule_leases AS expired
        JOIN outboxkit_schedules AS schedule ON schedule.id = expired.schedule_id
        WHERE expired.expires_at <= :now
        ORDER BY expired.expires_at
        LIMIT :limit
        FOR UPDATE OF expired, schedule SKIP LOCKED
    )
    RETURNING lease.token, lease.schedule_id, lease.run_id, lease.scheduled_for, lease.holder, lease.attempt,
              lease.expires_at
    """
)


@dataclass(frozen=True, kw_only=True)
class LeaseGrant:
    """A run this process may start: the lease it holds and the occurrence it runs."""

    token: uuid.UUID
    schedule_id: int
    schedule_name: str
    job: str
    run_id: int
    scheduled_for: datetime
    attempt: int = 1
    note: str | None = None  # what the history says about a re-run
    next_run_at: datetime | None = None  # the schedule's next occurrence after this one (None: unknown or none)


def count_live(connection: Connection, schedule_id: int, *, now: datetime) -> int:
    """How many runs of the schedule hold a lease that has not expired."""
    return int(connection.execute(_COUNT_LIVE, {"schedule_id": schedule_id, "now": now}).scalar_one())


def take(
    connection: Connection,
    *,
    schedule_id: int,
    schedule_name: str,
    job: str,
    run_id: int,
    scheduled_for: datetime,
    holder: str,
    now: datetime,
    seconds: float,
    attempt: int = 1,
    note: str | None = None,
) -> LeaseGrant:
    """Insert a lease in the caller's transaction (which holds the schedule row's lock)."""
    grant = LeaseGrant(
        token=uuid.uuid4(),
        schedule_id=schedule_id,
        schedule_name=schedule_name,
        job=job,
        run_id=run_id,
        scheduled_for=scheduled_for,
        attempt=attempt,
        note=note,
    )
    connection.execute(
        _TAKE,
        {
            "token": grant.token,
            "schedule_id": schedule_id,
            "run_id": run_id,
            "scheduled_for": scheduled_for,
            "holder": holder,
            "attempt": attempt,
            "now": now,
            "expires_at": now + timedelta(seconds=seconds),
        },
    )
    return grant


def renew(connection: Connection, tokens: Collection[uuid.UUID], *, expires_at: datetime) -> set[uuid.UUID]:
    """Move the expiry of these leases; returns the tokens still held (a missing one was swept as expired)."""
    if not tokens:
        return set()
    return set(connection.execute(_RENEW, {"tokens": list(tokens), "expires_at": expires_at}).scalars())


def release(connection: Connection, token: uuid.UUID) -> bool:
    """Delete a lease; False if it was gone already (it expired and was swept)."""
    return connection.execute(_RELEASE, {"token": token}).first() is not None


def take_expired(connection: Connection, *, now: datetime, limit: int = 100) -> Sequence[RowMapping]:
    """Delete up to ``limit`` expired leases and return them, in the caller's transaction."""
    return connection.execute(_TAKE_EXPIRED, {"now": now, "limit": limit}).mappings().all()
