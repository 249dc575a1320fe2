"""The claim's writes: what one transaction does with a due schedule row, and with an expired lease.

``ScheduleRunner`` (``outboxkit.schedules.runner``) opens the transactions;
this module decides, inside them, under the schedule row's lock:

* ``due``: the rows this process can fire (its jobs, its outboxes) whose
  ``next_run_at`` has passed, ``FOR UPDATE SKIP LOCKED``, so two processes
  take disjoint rows;
* ``fire``: for a job, the live leases counted again under the row's lock (the
  select's snapshot may predate a re-run the sweep committed; a row with no
  free slot is left due); the occurrence to run and the missed ones
  (``outboxkit.schedules.misfires``),
  each written to the run history under the fence ``(name, fire time)``
  (``outboxkit.schedules.fences``: it outlives the history's trim);
  the HTTP request inserted into its outbox (``enqueued``) or the job's lease
  taken (``running``); and ``next_run_at`` advanced.  A job's row whose
  ``max_running`` leases are live is not claimed: it stays due until a slot
  frees.  All of it commits or none of it does;
* ``abandon``: an expired lease's run marked ``abandoned``, and re-run once
  (a new lease, attempt 2) when the schedule allows it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, bindparam, insert, text

from outboxkit.errors import InvalidScheduleError
from outboxkit.results import RunRecord
from outboxkit.schedules import leases
from outboxkit.schedules.definitions import HttpTarget, ScheduleDefinition
from outboxkit.schedules.fences import take_fence_sql
from outboxkit.schedules.leases import LeaseGrant
from outboxkit.schedules.misfires import FiringPlan, plan_firing
from outboxkit.schedules.requests import ScheduledRequestOutbox
from outboxkit.schedules.rows import definition_from_row
from outboxkit.storage.notify import notify_statement
from outboxkit.telemetry.log_events import log_fields

__all__ = ["Firing", "ScheduleClaims"]

logger = logging.getLogger(__name__)

# A disabled row is claimed only for the one occurrence "run now" asked for (run_now_pending).
_CLAIMABLE = """
    (enabled OR run_now_pending) AND next_run_at IS NOT NULL
    AND ((target_kind = 'job' AND job IN :jobs) OR (target_kind = 'http' AND http_outbox IN :outboxes))
"""
# A job's row whose max_running runs hold live leases waits, due and unclaimed, until a slot frees (the run
# ends, or its lease expires and is swept): its occurrences then coalesce within the grace, as after downtime.
_HAS_SLOT = """
    (target_kind <> 'job' OR max_running > (
        SELECT count(*) FROM outboxkit_schedule_leases AS lease
        WHERE lease.schedule_id = outboxkit_schedules.id AND lease.expires_at > :now))
"""
_CLAIM = text(
    f"""
    SELECT * FROM outboxkit_schedules
    WHERE {_CLAIMABLE} AND target_kind = :kind AND next_run_at <= :now AND id NOT IN :skip AND {_HAS_SLOT}
    ORDER BY next_run_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
).bindparams(bindparam("jobs", expanding=True), bindparam("outboxes", expanding=True), bindparam("skip", expanding=True))
_NEAREST = text(
    f"""
    SELECT (SELECT min(next_run_at) FROM outboxkit_schedules
            WHERE {_CLAIMABLE} AND (target_kind <> 'job' OR :jobs_free) AND {_HAS_SLOT}),
           (SELECT min(expires_at) FROM outboxkit_schedule_leases),
           clock_timestamp()
    """
).bindparams(bindparam("jobs", expanding=True), bindparam("outboxes", expanding=True))
_ADVANCE = text("UPDATE outboxkit_schedules SET next_run_at = :next_run_at, run_now_pending = false WHERE id = :id")
# Under the fence (outboxkit.schedules.fences): the schedule's mark, then the occurrence's own history row.
_RECORD = text(
    f"""
    WITH {take_fence_sql(":name")}
    INSERT INTO outboxkit_job_runs (job_id, job_name, scheduled_for, started_at, finished_at, outcome, counts, error, leader)
    SELECT :name, :name, :scheduled_for, clock_timestamp(),
           CASE WHEN :outcome = 'running' THEN NULL ELSE clock_timestamp() END,
           :outcome, CAST(:counts AS jsonb), :error, :holder
    FROM fence WHERE fence.fired_through < :scheduled_for
    ON CONFLICT (job_id, scheduled_for) DO NOTHING
    RETURNING id
    """
)
_SET_COUNTS = text("UPDATE outboxkit_job_runs SET counts = counts || CAST(:counts AS jsonb) WHERE id = :run_id")
_ABANDON = text(
    """
    UPDATE outboxkit_job_runs SET outcome = 'abandoned', error = :error
    WHERE id = :run_id AND outcome = 'running'
    RETURNING job_id
    """
)
_RESTART = text(
    "UPDATE outboxkit_job_runs SET outcome = 'running', leader = :holder, error = :note WHERE id = :run_id"
)
_ONE = text("SELECT * FROM outboxkit_schedules WHERE name = :name FOR UPDATE")
_SCHEDULE = text("SELECT id, name, job, max_running, rerun_if_abandoned FROM outboxkit_schedules WHERE id = :id")


@dataclass
class Firing:
    """What one step did: runs started, requests enqueued, occurrences missed, runs abandoned, rows that failed."""

    runs: list[Future[RunRecord]] = field(default_factory=list)
    enqueued: list[tuple[str, datetime]] = field(default_factory=list)
    missed: list[tuple[str, datetime]] = field(default_factory=list)
    abandoned: list[tuple[str, datetime]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def extend(self, other: Firing) -> None:
        for name in ("runs", "enqueued", "missed", "abandoned", "failed"):
            getattr(self, name).extend(getattr(other, name))


class ScheduleClaims:
    """The claim's reads and writes for one runner: its ``holder`` name, its jobs and outboxes, its lease length."""

    def __init__(
        self,
        *,
        jobs: Collection[str],
        outboxes: Mapping[str, type[ScheduledRequestOutbox]],
        holder: str,
        lease_seconds: float,
    ) -> None:
        self.jobs = frozenset(jobs)
        self.outboxes = dict(outboxes)
        self.holder = holder
        self.lease_seconds = lease_seconds

    def _claimable(self) -> dict[str, Any]:
        # An empty IN list is a syntax error in some drivers; a name no row has keeps the query plain.
        return {"jobs": sorted(self.jobs) or [""], "outboxes": sorted(self.outboxes) or [""]}

    def due(
        self, connection: Connection, *, now: datetime, skip: Collection[int], limit: int, kind: str
    ) -> Sequence[RowMapping]:
        """Lock up to ``limit`` due rows of target ``kind`` (``job``, ``http``) this process can fire, skipping rows
        others hold and the ids in ``skip``."""
        values = {**self._claimable(), "now": now, "skip": list(skip) or [0], "limit": limit, "kind": kind}
        return connection.execute(_CLAIM, values).mappings().all()

    def one(self, connection: Connection, name: str) -> RowMapping | None:
        """Lock the row named ``name`` (waiting for a claim that holds it)."""
        return connection.execute(_ONE, {"name": name}).mappings().first()

    def nearest(
        self, connection: Connection, *, now: datetime, jobs_free: bool = True
    ) -> tuple[datetime | None, datetime | None, datetime]:
        """The nearest ``next_run_at`` of a row this process can fire (with a free slot at ``now``; of an HTTP
        target only, unless ``jobs_free``: this process has a worker free), the nearest lease expiry (None: none)
        and the database server's clock."""
        values = {**self._claimable(), "now": now, "jobs_free": jobs_free}
        due, expiry, database_now = connection.execute(_NEAREST, values).one()
        return due, expiry, database_now

    def fire(self, connection: Connection, row: RowMapping, *, now: datetime, firing: Firing) -> LeaseGrant | None:
        try:
            definition = definition_from_row(row)
        except InvalidScheduleError as exc:  # edited by hand in SQL: park it rather than claim it forever
            logger.error(
                "schedule %s holds an invalid definition (%s); it will not fire until it is edited", row["name"], exc,
                extra=log_fields("schedule.invalid_definition"),
            )
            connection.execute(_ADVANCE, {"id": row["id"], "next_run_at": None})
            return None
        if not isinstance(definition.target, HttpTarget) and not self._slot_free(connection, row, definition, now):
            return None
        plan = plan_firing(definition.trigger, due=row["next_run_at"], now=now, grace=definition.grace)
        if plan.missed_first is not None:
            self._record_missed(connection, definition, plan, firing)
        grant = None
        if plan.run_for is not None:
            covered = plan.coalesced_count
            if isinstance(definition.target, HttpTarget):
                self.enqueue(
                    connection, definition, definition.target, plan.run_for, now=now, firing=firing, coalesced=covered
                )
            else:  # counted under this row's lock: no other lease can have been taken since
                grant = self.lease(
                    connection, row, definition, plan.run_for, now=now, firing=firing, slot_free=True, coalesced=covered
                )
            if covered:
                logger.info(
                    "%s: the occurrence %s also covers %d earlier fire time(s) within the grace (counts.coalesced)",
                    definition.name, plan.run_for.isoformat(), covered,
                    extra=log_fields("schedule.coalesced", coalesced=covered),
                )
        connection.execute(_ADVANCE, {"id": row["id"], "next_run_at": plan.next_run_at})
        return None if grant is None else dataclasses.replace(grant, next_run_at=plan.next_run_at)

    def _slot_free(self, connection: Connection, row: RowMapping, definition: ScheduleDefinition, now: datetime) -> bool:
        # The claim's select counted the live leases in its own snapshot, which may predate the commit of a sweep
        # that re-ran an abandoned run under this row's lock; this statement, under the lock the claim holds now,
        # sees every lease committed.  A row whose slots are taken is left as it is: due, waiting for a slot.
        return leases.count_live(connection, row["id"], now=now) < definition.max_running

    def record(
        self, connection: Connection, name: str, scheduled_for: datetime, outcome: str, *,
        counts: Mapping[str, int] | None = None, error: str | None = None,
    ) -> int | None:
        """Insert the occurrence into the run history under the fence; None if it is there already."""
        values = {
            "name": name,
            "scheduled_for": scheduled_for,
            "outcome": outcome,
            "counts": json.dumps(dict(counts or {})),
            "error": error,
            "holder": self.holder,
        }
        run_id = connection.execute(_RECORD, values).scalar()
        if run_id is None:
            logger.warning(
                "%s: the occurrence %s is in the run history already; not fired again", name, scheduled_for.isoformat(),
                extra=log_fields("schedule.already_fired"),
            )
        return run_id

    def _record_missed(self, connection: Connection, definition: ScheduleDefinition, plan: FiringPlan, firing: Firing) -> None:
        assert plan.missed_first is not None
        message = plan.describe_missed(definition.grace)
        counts = {"missed": plan.missed_count}
        self.record(connection, definition.name, plan.missed_first, "missed", counts=counts, error=message)
        logger.warning("%s: %s", definition.name, message, extra=log_fields("schedule.missed"))
        firing.missed.append((definition.name, plan.missed_first))

    def enqueue(
        self, connection: Connection, definition: ScheduleDefinition, target: HttpTarget, scheduled_for: datetime,
        *, now: datetime, firing: Firing, coalesced: int = 0,
    ) -> int | None:
        run_id = self.record(connection, definition.name, scheduled_for, "enqueued", counts=_covering(coalesced))
        if run_id is None:
            return None
        outbox = self.outboxes[target.outbox]
        row_id = connection.execute(
            insert(outbox)
            .values(
                schedule_name=definition.name,
                scheduled_for=scheduled_for,
                method=target.method,
                url=target.url,
                headers=dict(target.headers),
                body=target.body,
                next_attempt_at=now,
            )
            .returning(outbox.id)
        ).scalar_one()
        connection.execute(_SET_COUNTS, {"run_id": run_id, "counts": json.dumps({"outbox_row": row_id})})
        connection.execute(notify_statement(outbox))
        firing.enqueued.append((definition.name, scheduled_for))
        return int(row_id)

    def lease(
        self, connection: Connection, row: RowMapping, definition: ScheduleDefinition, scheduled_for: datetime,
        *, now: datetime, firing: Firing, slot_free: bool = False, coalesced: int = 0,
    ) -> LeaseGrant | None:
        live = 0 if slot_free else leases.count_live(connection, row["id"], now=now)
        if live >= definition.max_running:
            error = (
                f"not run: {live} run(s) of this schedule still held their lease (max_running={definition.max_running})"
            )
            if self.record(connection, definition.name, scheduled_for, "missed", error=error) is not None:
                logger.warning(
                    "%s: the occurrence %s was %s", definition.name, scheduled_for.isoformat(), error,
                    extra=log_fields("schedule.not_fired"),
                )
                firing.missed.append((definition.name, scheduled_for))
            return None
        run_id = self.record(connection, definition.name, scheduled_for, "running", counts=_covering(coalesced))
        if run_id is None:
            return None
        return leases.take(
            connection, schedule_id=row["id"], schedule_name=definition.name, job=row["job"], run_id=run_id,
            scheduled_for=scheduled_for, holder=self.holder, now=now, seconds=self.lease_seconds,
        )

    def abandon(
        self, connection: Connection, lease: RowMapping, *, now: datetime, firing: Firing
    ) -> LeaseGrant | None:
        schedule = connection.execute(_SCHEDULE, {"id": lease["schedule_id"]}).mappings().one()
        reason = (
            f"the run never finished: its lease, held by {lease['holder']}, expired at {lease['expires_at'].isoformat()} "
            f"(the process died or stalled); marked abandoned by {self.holder}"
        )
        rerun = schedule["rerun_if_abandoned"] and lease["attempt"] == 1
        if rerun and schedule["job"] not in self.jobs:
            reason += f"; not re-run: no job {schedule['job']!r} is registered in this process"
            rerun = False
        if rerun and leases.count_live(connection, schedule["id"], now=now) >= schedule["max_running"]:
            reason += f"; not re-run: max_running={schedule['max_running']} run(s) hold their lease"
            rerun = False
        connection.execute(_ABANDON, {"run_id": lease["run_id"], "error": reason})
        logger.warning(
            "%s: the run for %s: %s", schedule["name"], lease["scheduled_for"].isoformat(), reason,
            extra=log_fields("schedule.abandoned"),
        )
        firing.abandoned.append((schedule["name"], lease["scheduled_for"]))
        if not rerun:
            return None
        note = f"re-run once by {self.holder}: the first run's lease, held by {lease['holder']}, expired"
        connection.execute(_RESTART, {"run_id": lease["run_id"], "holder": self.holder, "note": note})
        return leases.take(
            connection, schedule_id=schedule["id"], schedule_name=schedule["name"], job=schedule["job"],
            run_id=lease["run_id"], scheduled_for=lease["scheduled_for"], holder=self.holder, now=now,
            seconds=self.lease_seconds, attempt=2, note=note,
        )


def _covering(coalesced: int) -> dict[str, int]:
    """A run's counts at its claim: how many earlier fire times it covers (kept whatever outcome it records)."""
    return {"coalesced": coalesced} if coalesced else {}
