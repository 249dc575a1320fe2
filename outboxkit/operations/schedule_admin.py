"""What an operator does with schedule rows: list, read the history, create, edit, enable, disable, run now, delete.

The list is paged by name (a keyset on the unique name, cursors as for the
rows of an outbox: ``outboxkit.operations.cursor``), and only the page's
schedules have their next fire times computed.

The admin's schedule pages and API and ``outboxkit schedules`` in the CLI
call ``ScheduleAdmin``; it calls ``outboxkit.schedules.store`` and
``outboxkit.schedules.views`` on the kit's operator database
(``outboxkit.storage.operator_pool``): the admin's own small pool, and a time
budget on every transaction (``OperatorQueryTimeout`` past it, nothing
changed).

A schedule declared in code is edited in the code: its edit and delete are
refused (``ScheduleDeclaredInCode``, 409 in the admin, saying where the code
declares it); enable, disable and run now work on every row.

Every change is the store's: one transaction that locks the row, writes the
row and an entry in ``outboxkit_schedule_audit`` (action, actor, the row
before and after) and sends ``NOTIFY outboxkit_schedules``, which wakes
every process's ``ScheduleRunner``, so an edit applies everywhere within a
second.  A refused change (``InvalidScheduleError``, naming the field;
``UnknownScheduleError``) writes nothing.

Which job names a schedule may target: the jobs registered on the kit
(``kit.schedules.add_job`` and ``register_job``), the ``jobs`` given here
(names that other processes' runners register; the admin takes them as
``create_admin_router(schedule_jobs=...)``), and every job a schedule row
already targets (a row was checked against its process's registry when it
was written, so a job that the code's own schedules run is known to the CLI
too).  HTTP targets may name the kit's ``ScheduledRequestOutbox`` outboxes.

The list also carries the jobs the elected leader runs (the kit's own, and
any registered with the deprecated ``kit.scheduler.add_job``), read-only
and marked internal (``ScheduleAdmin.internal``, ``outboxkit.operations.internal_jobs``),
so one list shows everything that runs on a schedule.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Connection, select

from outboxkit.errors import InvalidValueError, ScheduleDeclaredInCode
from outboxkit.kit import OutboxKit
from outboxkit.operations.cursor import InvalidCursor, decode_name_cursor, encode_cursor
from outboxkit.operations.internal_jobs import InternalJobs
from outboxkit.operations.job_status import JobRun, JobSource, last_runs
from outboxkit.operations.schedule_schemas import (
    FireTimeModel,
    ScheduleAction,
    ScheduleActionResult,
    ScheduleAuditEntry,
    ScheduleCreate,
    ScheduleFields,
    ScheduleHistoryPage,
    ScheduleListView,
    ScheduleModel,
    ScheduleRunModel,
)
from outboxkit.schedules.requests import ScheduledRequestOutbox
from outboxkit.schedules.rows import Schedule, redact_snapshot
from outboxkit.schedules.store import ScheduleStore
from outboxkit.schedules.views import next_fire_times, schedule_history
from outboxkit.storage.tables import schedule_audit, schedules

__all__ = ["DEFAULT_LIST_PAGE", "FIRE_TIMES_SHOWN", "MAX_HISTORY_PAGE", "MAX_LIST_PAGE", "ScheduleAdmin"]

FIRE_TIMES_SHOWN = 5
DEFAULT_LIST_PAGE = 50  # schedules per page of the list
MAX_LIST_PAGE = 200  # the largest page of the list (the API's page-size cap)
LIST_SCOPE = "schedules"  # the list's cursors (outboxkit.operations.cursor)
MAX_HISTORY_PAGE = 200  # runs per history page (the API's page-size cap)
ACTOR_LENGTH = 300  # the audit's and the row's actor columns


def _run_model(run: JobRun | None) -> ScheduleRunModel | None:
    if run is None:
        return None
    return ScheduleRunModel(
        scheduled_for=run.scheduled_for, started_at=run.started_at, finished_at=run.finished_at,
        outcome=run.outcome, counts=run.counts, error=run.error, holder=run.leader,
    )


class ScheduleAdmin:
    """The operator's reads and changes of schedule rows over one kit (see the module docstring)."""

    def __init__(self, kit: OutboxKit, *, jobs: Collection[str] = (), job_source: JobSource | None = None) -> None:
        """``job_source`` lists the elected jobs (default: the kit's own registry, ``kit.scheduler``)."""
        self.kit = kit
        # The kit's own registry (``kit.schedules``: jobs declared or registered in code) and the names given.
        self.declared_jobs = frozenset(jobs) | frozenset(kit.schedules.jobs)
        self.internal = InternalJobs(kit, job_source)

    @property
    def request_outboxes(self) -> list[str]:
        """The outboxes an HTTP target may name: the kit's ``ScheduledRequestOutbox`` ones."""
        return sorted(
            outbox.__outbox__.job_name for outbox in self.kit.outboxes if issubclass(outbox, ScheduledRequestOutbox)
        )

    def job_names(self, connection: Connection | None = None) -> list[str]:
        """The jobs a schedule may target: the declared ones and every job a schedule row targets."""
        if connection is None:
            with self.kit.operator_database.connect() as connection:
                return self.job_names(connection)
        targeted = connection.execute(select(schedules.c.job).where(schedules.c.job.is_not(None)).distinct()).scalars()
        return sorted(self.declared_jobs | set(targeted))

    def _store(self) -> ScheduleStore:
        return ScheduleStore(
            self.kit.operator_database, clock=self.kit.clock, jobs=self.job_names(), outboxes=self.kit.outboxes,
            url_guard=self.kit.url_guard, run_now_per_minute=self.kit.settings.schedule_run_now_per_minute,
            secret_names=self.kit.settings.secrets,
        )

    # -- reads ---------------------------------------------------------------

    def overview(
        self, *, viewer_timezone: str = "UTC", cursor: str | None = None, limit: int = DEFAULT_LIST_PAGE
    ) -> ScheduleListView:
        """One page of schedules by name, each with its next five fire times (its timezone and the viewer's) and last run.

        ``cursor`` is a page's ``next_cursor`` or ``previous_cursor``
        (``InvalidCursor`` for anything else); ``limit`` is 1 to
        ``MAX_LIST_PAGE`` (``InvalidValueError`` naming ``limit``).  Only
        the page's schedules have their fire times computed and their last
        run read, so a page costs the same with ten or a hundred thousand rows.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_PAGE:
            raise InvalidValueError(f"limit must be a whole number from 1 to {MAX_LIST_PAGE}, got {limit!r}")
        after = before = None
        if cursor:
            try:
                after = decode_name_cursor(cursor, scope=LIST_SCOPE)
            except InvalidCursor:
                before = decode_name_cursor(cursor, scope=LIST_SCOPE + ":before")
        self._check_zone(viewer_timezone)
        reader = ScheduleStore(self.kit.operator_database, clock=self.kit.clock)
        # One more than the page: whether a page lies beyond it, without counting.
        found = reader.page(after=after, before=before, limit=limit + 1)
        more = len(found) > limit
        rows = (found[1:] if before is not None else found[:limit]) if more else found
        with self.kit.operator_database.connect() as connection:
            runs = last_runs(connection, [row.name for row in rows])
            jobs = self.job_names(connection)
        # Forwards: earlier schedules exist once a cursor was followed.  Backwards: later ones always do.
        has_next = more if before is None else bool(rows)
        has_previous = (after is not None) if before is None else more
        return ScheduleListView(
            generated_at=self.kit.clock.now(),
            viewer_timezone=viewer_timezone,
            limit=limit,
            schedules=[self._model(row, runs.get(row.name), viewer_timezone) for row in rows],
            next_cursor=encode_cursor(LIST_SCOPE, (rows[-1].name,)) if has_next and rows else None,
            previous_cursor=encode_cursor(LIST_SCOPE + ":before", (rows[0].name,)) if has_previous and rows else None,
            jobs=jobs,
            outboxes=self.request_outboxes,
            internal_jobs=self.internal.view(),
        )

    def schedule(self, name: str, *, viewer_timezone: str = "UTC") -> ScheduleModel:
        """One schedule (``UnknownScheduleError`` for a name no row has)."""
        self._check_zone(viewer_timezone)
        row = self._store().get(name)
        with self.kit.operator_database.connect() as connection:
            run = last_runs(connection, [name]).get(name)
        return self._model(row, run, viewer_timezone)

    def editable(self, name: str, *, action: str = "edit") -> ScheduleModel:
        """One schedule that may be edited (or deleted, ``action="delete"``) here; one declared in code raises
        ``ScheduleDeclaredInCode`` saying where, as the change itself would."""
        model = self.schedule(name)
        if model.defined_in == "code":
            raise ScheduleDeclaredInCode(name, model.declared_at, action=action)
        return model

    def history(
        self, name: str, *, outcomes: Collection[str] | None = None, before: datetime | None = None, limit: int = 50
    ) -> ScheduleHistoryPage:
        """The recorded occurrences of ``name``, newest first; ``before`` is the previous page's ``next_before``.

        The history outlives its schedule: a deleted schedule's runs are still listed.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_PAGE:
            raise InvalidValueError(f"limit must be a whole number from 1 to {MAX_HISTORY_PAGE}, got {limit!r}")
        wanted = sorted(set(outcomes)) if outcomes else None
        # One more than the page: whether an older page exists, without counting.
        found = schedule_history(self.kit.operator_database, name, limit=limit + 1, outcomes=wanted, before=before)
        page = found[:limit]
        return ScheduleHistoryPage(
            name=name,
            outcomes=wanted,
            runs=[ScheduleRunModel.model_validate(run) for run in page],
            next_before=page[-1].scheduled_for if len(found) > limit else None,
        )

    def audit(self, name: str, *, limit: int = 20) -> list[ScheduleAuditEntry]:
        """The newest ``limit`` changes of ``name`` (who, when, what; before and after)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_PAGE:
            raise InvalidValueError(f"limit must be a whole number from 1 to {MAX_HISTORY_PAGE}, got {limit!r}")
        statement = (
            select(schedule_audit)
            .where(schedule_audit.c.schedule == name)
            .order_by(schedule_audit.c.at.desc(), schedule_audit.c.id.desc())
            .limit(limit)
        )
        with self.kit.operator_database.connect() as connection:
            rows = connection.execute(statement).mappings().all()
        return [
            ScheduleAuditEntry.model_validate(
                {**row, **{side: redact_snapshot(row[side]) for side in ("before", "after") if row[side] is not None}}
            )
            for row in rows
        ]

    # -- changes -------------------------------------------------------------

    def create(self, request: ScheduleCreate, *, actor: str) -> ScheduleActionResult:
        schedule = self._store().create(request.definition(request.name), actor=actor[:ACTOR_LENGTH])
        return self._result("create", schedule)

    def edit(self, name: str, fields: ScheduleFields, *, actor: str) -> ScheduleActionResult:
        """Replace the definition of ``name`` (a name no row has: ``UnknownScheduleError``, nothing created)."""
        schedule = self._store().replace(fields.definition(name), actor=actor[:ACTOR_LENGTH])
        return self._result("edit", schedule)

    def enable(self, name: str, *, actor: str) -> ScheduleActionResult:
        return self._result("enable", self._store().set_enabled(name, True, actor=actor[:ACTOR_LENGTH]))

    def disable(self, name: str, *, actor: str) -> ScheduleActionResult:
        return self._result("disable", self._store().set_enabled(name, False, actor=actor[:ACTOR_LENGTH]))

    def run_now(self, name: str, *, actor: str) -> ScheduleActionResult:
        """One occurrence at this instant, then its trigger's own; a disabled schedule runs it and stays disabled."""
        return self._result("run_now", self._store().run_now(name, actor=actor[:ACTOR_LENGTH]))

    def delete(self, name: str, *, actor: str) -> ScheduleActionResult:
        """Delete the row; its history and audit stay, and a run in progress finishes and is recorded."""
        self._store().delete(name, actor=actor[:ACTOR_LENGTH])
        return ScheduleActionResult(action="delete", name=name, schedule=None)

    # -- internals -----------------------------------------------------------

    def _result(self, action: ScheduleAction, schedule: Schedule) -> ScheduleActionResult:
        with self.kit.operator_database.connect() as connection:
            run = last_runs(connection, [schedule.name]).get(schedule.name)
        return ScheduleActionResult(action=action, name=schedule.name, schedule=self._model(schedule, run, "UTC"))

    @staticmethod
    def _check_zone(viewer_timezone: str) -> None:
        """Refuse an unknown viewer timezone even when no schedule would be shown in it."""
        try:
            ZoneInfo(viewer_timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidValueError(
                f"viewer_timezone: unknown IANA timezone {viewer_timezone[:64]!r} (e.g. 'Europe/Berlin', 'UTC')"
            ) from None

    @staticmethod
    def _model(schedule: Schedule, run: JobRun | None, viewer_timezone: str) -> ScheduleModel:
        definition = schedule.definition
        times = next_fire_times(schedule, count=FIRE_TIMES_SHOWN, viewer_timezone=viewer_timezone)
        return ScheduleModel(
            name=schedule.name,
            definition=ScheduleFields.of(definition),
            description=definition.trigger.describe(),
            next_run_at=schedule.next_run_at if definition.enabled else None,  # a disabled schedule never runs next
            next_fire_times=[FireTimeModel(at=time.at, local=time.local, viewer=time.viewer) for time in times],
            viewer_timezone=viewer_timezone,
            last_run=_run_model(run),
            defined_in=schedule.defined_in,
            declared_at=schedule.declared_at,
            created_at=schedule.created_at,
            created_by=schedule.created_by,
            changed_at=schedule.changed_at,
            changed_by=schedule.changed_by,
        )
