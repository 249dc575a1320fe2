"""Which occurrences of a due schedule run, which are missed, and when it is next due.

A schedule row is due when its ``next_run_at`` has passed.  By the time a
runner claims it, more occurrences may have passed too (every process was
down, or busy).  ``plan_firing`` decides, from the trigger, the row's
``next_run_at`` (``due``), the claim's ``now`` and the schedule's misfire
grace:

* every occurrence in ``[now - grace, now]`` is late but within the grace:
  they coalesce into **one** run, for the latest of them, and that run
  records how many earlier fire times it covers (``coalesced_count``, at
  most ``COALESCED_COUNT_LIMIT``), so none of them vanishes from the history;
* every occurrence before ``now - grace`` is **missed**: not run, but
  recorded (one history row with their count and range), never dropped in
  silence;
* ``next_run_at`` becomes the first fire time after ``now`` (None when the
  trigger has no more, e.g. a ``once`` that fired).

``due`` itself counts as an occurrence even when it is not a fire time of
the trigger: "run now" sets ``next_run_at`` to the instant it was asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from outboxkit.schedules.definitions import ScheduleTrigger

__all__ = ["COALESCED_COUNT_LIMIT", "FiringPlan", "plan_firing"]

MISSED_COUNT_LIMIT = 1000  # beyond this many, the missed range is counted as "more than"
COALESCED_COUNT_LIMIT = 1000  # a run covers at most this many counted earlier fire times (a long grace, a short period)
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, kw_only=True)
class FiringPlan:
    """What one claim does with a due schedule."""

    run_for: datetime | None  # the occurrence to run (the latest within the grace), or None
    missed_first: datetime | None = None  # the missed occurrences, oldest and newest
    missed_last: datetime | None = None
    missed_count: int = 0
    missed_count_exact: bool = True
    next_run_at: datetime | None = None
    coalesced_count: int = 0  # the earlier fire times within the grace that the run covers

    def describe_missed(self, grace: timedelta) -> str:
        assert self.missed_first is not None and self.missed_last is not None
        count = str(self.missed_count) if self.missed_count_exact else f"more than {self.missed_count}"
        span = (
            self.missed_first.isoformat()
            if self.missed_first == self.missed_last
            else f"{self.missed_first.isoformat()} to {self.missed_last.isoformat()}"
        )
        return (
            f"{count} occurrence(s) ({span}) found due more than their misfire grace "
            f"({grace.total_seconds():g} s) late: not run"
        )


def plan_firing(trigger: ScheduleTrigger, *, due: datetime, now: datetime, grace: timedelta) -> FiringPlan:
    """Split the occurrences from ``due`` to ``now`` into one run (within ``grace``) and the missed ones."""
    cutoff = now - grace
    run_for = trigger.latest_at_or_before(now, not_before=max(due, cutoff))
    if run_for is None and cutoff <= due <= now:
        run_for = due
    next_run_at = trigger.first_after(now)
    coalesced = _count_covered(trigger, due=due, cutoff=cutoff, run_for=run_for)
    if due >= cutoff:
        return FiringPlan(run_for=run_for, next_run_at=next_run_at, coalesced_count=coalesced)
    missed_last = trigger.latest_at_or_before(cutoff - _TICK, not_before=due) or due
    count, exact = 1, True
    occurrence = trigger.first_after(due)
    while occurrence is not None and occurrence < cutoff:
        if count == MISSED_COUNT_LIMIT:
            exact = False
            break
        count += 1
        occurrence = trigger.next_after(occurrence)
    return FiringPlan(
        run_for=run_for,
        missed_first=due,
        missed_last=missed_last,
        missed_count=count,
        missed_count_exact=exact,
        next_run_at=next_run_at,
        coalesced_count=coalesced,
    )


def _count_covered(trigger: ScheduleTrigger, *, due: datetime, cutoff: datetime, run_for: datetime | None) -> int:
    """The occurrences within the grace before ``run_for``: ``due`` itself (it may be off the trigger's grid) when it
    is within the grace, and the fire times after it.  An on-time claim (``run_for == due``) asks the trigger nothing."""
    if run_for is None:
        return 0
    count = 0
    occurrence = due if due >= cutoff else trigger.first_at_or_after(cutoff)
    while occurrence is not None and occurrence < run_for and count < COALESCED_COUNT_LIMIT:
        count += 1
        occurrence = trigger.first_after(occurrence)
    return count
