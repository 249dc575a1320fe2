"""The token buckets of rate-limited destinations (``outboxkit_destination_rates``), shared by every process.

``take`` runs the rule of ``outboxkit.rate_limits`` on one destination's
bucket under its row lock, in one short transaction of its own: the row is
created full on the first take (``INSERT ... ON CONFLICT DO NOTHING``), read
``FOR UPDATE``, and written back.  Two processes taking tokens at once are
serialized by the lock, so no token is granted twice; that is what makes the
limit hold across processes.  Nothing here runs for a destination without a
limit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert

from outboxkit.rate_limits import Bucket, Take, take
from outboxkit.storage.tables import destination_rates as rate_table

__all__ = ["RateStore"]


class RateStore:
    """The bucket statements of one outbox (its job name keys its rows)."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name

    def take(
        self, connection: Connection, destination: str, wanted: int, *, now: datetime, per_second: float, burst: float
    ) -> Take:
        """Take up to ``wanted`` tokens of ``destination``'s bucket, in the caller's transaction."""
        table = rate_table
        connection.execute(
            insert(table)
            .values(outbox=self.job_name, destination=destination, tokens=burst, refilled_at=now)
            .on_conflict_do_nothing()
        )
        row = connection.execute(
            select(table.c.tokens, table.c.refilled_at, table.c.deferred_until)
            .where(table.c.outbox == self.job_name, table.c.destination == destination)
            .with_for_update()
        ).one()
        result = take(
            Bucket(tokens=row.tokens, refilled_at=row.refilled_at, deferred_until=row.deferred_until),
            wanted,
            now=now,
            per_second=per_second,
            burst=burst,
        )
        bucket = result.bucket
        connection.execute(
            update(table)
            .where(table.c.outbox == self.job_name, table.c.destination == destination)
            .values(tokens=bucket.tokens, refilled_at=bucket.refilled_at, deferred_until=bucket.deferred_until, updated_at=now)
        )
        return result

    def bucket(self, connection: Connection, destination: str) -> Bucket | None:
        """The stored bucket of ``destination``, or None before its first send."""
        table = rate_table
        row = connection.execute(
            select(table.c.tokens, table.c.refilled_at, table.c.deferred_until).where(
                table.c.outbox == self.job_name, table.c.destination == destination
            )
        ).one_or_none()
        return None if row is None else Bucket(tokens=row.tokens, refilled_at=row.refilled_at, deferred_until=row.deferred_until)
