"""What the schedule fault scenarios read back: the job's own runs and the run history, and their checks.

The job's own table (``fault_schedule_runs``, see ``schedule_worker``) is the
witness of duplicates: a second run of one occurrence inserts a second row.
The run history says what the engine decided for every occurrence (``ok``,
``error``, ``missed``, ``abandoned``...).  The checks:

* ``duplicates``: occurrences the job ran more than once;
* ``uncovered``: fire times of the trigger in a window that neither ran nor
  coalesced into a later run within the grace (a lost occurrence);
* ``overlaps``: runs of one schedule that started before the previous run
  of that schedule had finished (a job overlapping itself);
* ``early``: runs that started before their fire time by the database's
  clock (a process whose clock runs ahead firing early).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, select, text

from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.schedules.store import ScheduleStore
from tests.faults.schedule_worker import install_runs_table, runs_table

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)  # the anchor of every(): fire times are multiples of the period


def install_schedules(engine: Engine, *, count: int, period: float, grace: float, prefix: str = "tick") -> list[str]:
    """The kit's tables, the job's table and ``count`` schedules ``every(period)`` running ``record``."""
    from outboxkit.storage.tables import kit_metadata

    kit_metadata.create_all(engine, checkfirst=True)
    install_runs_table(engine)
    store = ScheduleStore(engine, jobs=["record"])
    names = [f"{prefix}-{index}" for index in range(count)]
    for name in names:
        store.create(
            ScheduleDefinition(name=name, trigger=ScheduleTrigger.every(seconds=period), target=JobTarget(job="record"),
                               misfire_grace_seconds=int(grace)),
            actor="fault",
        )  # fmt: skip
    return names


@dataclass(frozen=True)
class JobRun:
    name: str
    scheduled_for: datetime
    holder: str
    started_at: datetime
    finished_at: datetime | None


@dataclass
class ScheduleLedger:
    runs: list[JobRun]
    history: dict[str, dict[datetime, str]]  # name -> fire time -> outcome

    @classmethod
    def read(cls, engine: Engine) -> ScheduleLedger:
        with engine.connect() as connection:
            runs = [JobRun(*row) for row in connection.execute(
                select(runs_table.c.name, runs_table.c.scheduled_for, runs_table.c.holder, runs_table.c.started_at,
                       runs_table.c.finished_at).order_by(runs_table.c.started_at)
            )]  # fmt: skip
            history: dict[str, dict[datetime, str]] = collections.defaultdict(dict)
            for name, scheduled_for, outcome in connection.execute(
                text("SELECT job_id, scheduled_for, outcome FROM outboxkit_job_runs")
            ):
                history[name][scheduled_for] = outcome
        return cls(runs=runs, history=dict(history))

    def outcomes(self) -> collections.Counter[str]:
        return collections.Counter(outcome for occurrences in self.history.values() for outcome in occurrences.values())

    def duplicates(self) -> list[tuple[str, datetime]]:
        counts = collections.Counter((run.name, run.scheduled_for) for run in self.runs)
        return sorted(key for key, count in counts.items() if count > 1)

    def uncovered(self, name: str, *, period: float, grace: float, start: datetime, end: datetime) -> list[datetime]:
        """Fire times in [start, end) neither in the history (other than ``missed``) nor coalesced into a later run."""
        fired = sorted(at for at, outcome in self.history.get(name, {}).items() if outcome != "missed")
        step = timedelta(seconds=period)
        moment = EPOCH + step * -(-(start - EPOCH) // step)
        lost = []
        while moment < end:
            later = [at for at in fired if moment <= at <= moment + timedelta(seconds=grace)]
            if not later:
                lost.append(moment)
            moment += step
        return lost

    def overlaps(self) -> list[tuple[JobRun, JobRun]]:
        by_name: dict[str, list[JobRun]] = collections.defaultdict(list)
        for run in self.runs:
            by_name[run.name].append(run)
        found = []
        for runs in by_name.values():
            for previous, run in zip(runs, runs[1:], strict=False):
                if previous.finished_at is not None and run.started_at < previous.finished_at:
                    found.append((previous, run))
        return found

    def early(self) -> list[JobRun]:
        return [run for run in self.runs if run.started_at < run.scheduled_for]

    def holders_between(self, start: datetime, end: datetime) -> set[str]:
        """The processes (holder name before the pid) that started a run in [start, end)."""
        return {run.holder.rsplit(":", 1)[0] for run in self.runs if start <= run.started_at < end}
