"""``drain_until_idle``: drain round after round, moving a ``ManualClock`` through the backoff, until nothing is due."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, func, select

from outboxkit.clock import ManualClock
from outboxkit.errors import ConfigurationError, InvalidValueError, NotIdleError
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.results import DrainResult
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.drain_queries import queries_for
from outboxkit.testing.recording import attached_recorders

__all__ = ["IdleReport", "drain_until_idle"]


@dataclass
class IdleReport:
    """What ``drain_until_idle`` did: totals per outbox (``results``, by job name) and where the clock ended."""

    rounds: int
    started_at: datetime
    finished_at: datetime
    results: dict[str, DrainResult]
    # rows still pending at the end: in backoff or scheduled later (when the clock was not advanced), or waiting
    # behind a stuck head of their ordering key (docs/destinations.md, "Ordered delivery")
    pending: int

    @property
    def delivered(self) -> int:
        return sum(result.delivered for result in self.results.values())

    @property
    def retried(self) -> int:
        return sum(result.retried for result in self.results.values())

    @property
    def stuck(self) -> int:
        return sum(result.stuck for result in self.results.values())

    @property
    def advanced(self) -> timedelta:
        """How far the clock moved."""
        return self.finished_at - self.started_at


def drain_until_idle(
    kit: OutboxKit,
    outbox: type[Outbox] | str | None = None,
    *,
    clock: ManualClock | None = None,
    advance_clock: bool = True,
    max_rounds: int = 100,
) -> IdleReport:
    """Drain every outbox of ``kit`` (or one) until no row is due; return what happened.

    Each round drains each outbox until nothing is due.  With
    ``advance_clock`` (the default) the kit's ``ManualClock`` is first brought
    up to the wall clock (rows your code just inserted are due by the
    database's ``now()``), and after each round it is moved to the earliest
    ``next_attempt_at`` of the pending rows, so retries run through the whole
    backoff table without waiting; it stops when no row is pending (or
    only rows waiting behind a stuck head of their ordering key are).  With
    ``advance_clock=False`` the clock is left alone and it stops when nothing
    is due now (rows in backoff stay pending; any clock works).

    ``clock``, if given, must be the kit's clock (it is there so a test can
    say which clock moves).  Raises ``ConfigurationError`` when time should
    move but the kit's clock is not a ``ManualClock``; ``NotIdleError`` when a
    drain fails or rows are still due after ``max_rounds`` rounds;
    ``UnexpectedSendError`` when an attached ``RecordingTransport`` saw an
    unexpected send (after the round that made it, so every outcome is
    recorded first).
    """
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise InvalidValueError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
    manual = _clock_to_move(kit, clock, advance_clock)
    outboxes = [kit.outbox(outbox)] if outbox is not None else kit.outboxes
    recorders = attached_recorders(kit, outboxes)
    if manual is not None:
        wall = datetime.now(timezone.utc)
        if manual.now() < wall:
            manual.set(wall)
    started_at = kit.clock.now()
    database_time = DatabaseTime(kit.clock)  # what is due is decided by the server's clock, or the ManualClock
    results = {each.__outbox__.job_name: DrainResult(job_name=each.__outbox__.job_name) for each in outboxes}
    for rounds in range(1, max_rounds + 1):
        for each in outboxes:
            result = kit.drain(each)
            results[each.__outbox__.job_name].add(result)
            if result.error is not None:
                raise NotIdleError(f"the drain of {result.job_name!r} failed in round {rounds}: {result.error}")
        for recorder in recorders:
            recorder.check()
        next_due = _next_due(kit.engine, outboxes, database_time)
        if next_due is None:  # nothing left a drain could claim (rows behind a stuck head of their key wait)
            return IdleReport(rounds, started_at, kit.clock.now(), results, pending=_pending(kit.engine, outboxes))
        if next_due > database_time.now():
            if manual is None:
                return IdleReport(rounds, started_at, kit.clock.now(), results, pending=_pending(kit.engine, outboxes))
            manual.set(next_due)
    raise NotIdleError(
        f"still not idle after {max_rounds} rounds (clock at {kit.clock.now().isoformat()}): "
        f"{_pending(kit.engine, outboxes)} row(s) pending, the next due at "
        f"{_next_due(kit.engine, outboxes, database_time)}; "
        "a row that is due but never claimed is usually locked by a transaction the test left open"
    )


def _clock_to_move(kit: OutboxKit, clock: ManualClock | None, advance_clock: bool) -> ManualClock | None:
    if clock is not None and clock is not kit.clock:
        raise ConfigurationError(
            f"drain_until_idle(clock=...) must be the kit's own clock ({kit.clock!r}); moving another clock "
            "would not make any row due. Build the kit with OutboxKit(..., clock=clock)"
        )
    if not advance_clock:
        return None
    if not isinstance(kit.clock, ManualClock):
        raise ConfigurationError(
            f"drain_until_idle can only move time on a ManualClock, and this kit's clock is {kit.clock!r}. "
            "Build the kit with OutboxKit(..., clock=ManualClock()), or pass advance_clock=False "
            "to drain only what is due now"
        )
    return kit.clock


def _next_due(engine: Engine, outboxes: Iterable[type[Outbox]], database_time: DatabaseTime) -> datetime | None:
    """The earliest due time of a row a drain could claim (with an ordering key, rows behind their key's head wait)."""
    with engine.connect() as connection:
        database_time.refresh(connection)
        now = database_time.parameter()
        times = [queries_for(outbox).earliest_due(connection, now=now) for outbox in outboxes]
    due = [moment for moment in times if moment is not None]
    return min(due) if due else None


def _pending(engine: Engine, outboxes: Iterable[type[Outbox]]) -> int:
    with engine.connect() as connection:
        return sum(
            connection.scalar(select(func.count()).select_from(outbox).where(outbox.status == "pending")) or 0
            for outbox in outboxes
        )
