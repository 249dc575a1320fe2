"""The schedule rows: create, edit, enable, disable, run now, delete, and the sync of schedules defined in code.

Each change is one short transaction that takes the row's lock
(``FOR UPDATE``), so it waits for a claim that holds the row and then
applies to the row as that claim left it (``next_run_at`` already
advanced).  It writes who did what, with the row before and after, into
``outboxkit_schedule_audit``, and ends with
``pg_notify('outboxkit_schedules', name)``: every
``ScheduleRunner`` listens on that channel and looks again at once, so an
edit applies on every process within a second.

``next_run_at`` is recomputed when a schedule is created (the first fire
time at or after now), when its trigger changes and when it is enabled
again (the first fire time after now);
an edit that leaves the trigger alone keeps it, so an occurrence that is due
stays due.  Occurrences that fell while a schedule was disabled are not
misfires: they are skipped, as the operator asked.

Schedules defined in code are written by ``sync_from_code`` when a process
starts: a new one is inserted, a changed one updated (its ``enabled`` and,
if its trigger is unchanged, its ``next_run_at`` kept), an unchanged one
left alone; with ``remove_missing`` (what the kit's start does) a row
defined in code that the code no longer defines is deleted.  So their state
lives in the database, and a process that
starts after a deploy finds an occurrence that fell during the deploy still
due, and runs it within its misfire grace.

The code is the one source of a declared schedule's definition: ``replace``
and ``delete`` refuse such a row (``ScheduleDeclaredInCode``, saying where
the code declares it), since the next start would write the code's
definition back.  Enabling, disabling and "run now" are the operator's and
apply to every row; a disable outlives a deploy.

A row and its definition, both ways, are ``schedules.rows``; the trigger arithmetic, the claims, the
leases and the runs are modules of their own.

One module, past 400 lines: every write of a schedule row (create, edit, enable, disable, run now, delete,
sync) goes through the same validation, audit and transaction here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, RowMapping, delete, select, text, update
from sqlalchemy.dialects.postgresql import insert

from outboxkit.clock import Clock
from outboxkit.errors import InvalidScheduleError, RunNowLimited, ScheduleDeclaredInCode, UnknownScheduleError, UnsafeUrlError
from outboxkit.model import Outbox
from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition
from outboxkit.schedules.requests import ScheduledRequestOutbox
from outboxkit.schedules.rows import Schedule, definition_from_row, definition_values, schedule_of, snapshot_of
from outboxkit.storage.database_time import DatabaseTime
from outboxkit.storage.tables import schedule_audit, schedules
from outboxkit.target_secrets import credential_problem
from outboxkit.url_guard import UrlGuard

__all__ = ["CHANNEL", "ScheduleStore", "Transactions"]

CHANNEL = "outboxkit_schedules"
_NOTIFY = text("SELECT pg_notify(:channel, :name)")
# One person's "run now" calls are counted under a lock of their own, so two at once cannot both pass the limit.
_LOCK_ACTOR = text("SELECT pg_advisory_xact_lock(hashtextextended('outboxkit-run-now:' || :actor, 0))")
# Their calls in the last minute, among the latest audit entries (newest first on the primary key: a bounded
# read whatever the table's size; far more changes than this in one minute would only lift the limit).
_RECENT_RUN_NOWS = text(
    "SELECT at FROM (SELECT actor, action, at FROM outboxkit_schedule_audit ORDER BY id DESC LIMIT 10000) AS recent "
    "WHERE actor = :actor AND action = 'run_now' AND at > :since ORDER BY at"
)


class Transactions(Protocol):
    """Where the store reads and writes: an ``Engine``, or the operator's ``OperatorDatabase`` (its time budget)."""

    def connect(self) -> AbstractContextManager[Connection]: ...

    def begin(self) -> AbstractContextManager[Connection]: ...


class ScheduleStore:
    """Reads and changes schedule rows.

    ``engine`` is an ``Engine`` or anything with its ``connect()`` and
    ``begin()`` (the admin and the CLI pass the kit's ``operator_database``,
    so each change runs within the operator's time budget).

    ``jobs`` are the names of the jobs registered in code and ``outboxes``
    the outbox classes the kit knows: a schedule may only target those (a
    job this code base cannot run, or an outbox that is not a
    ``ScheduledRequestOutbox``, is refused with the field named).
    ``reserved_names(name)`` says why a name may not be used, or None (the
    kit's store: the elected scheduler's job ids, which share the run history).
    ``url_guard`` checks the URL of an HTTP target created or edited here
    (``outboxkit.url_guard``; the kit's store passes the kit's, with the
    settings' allow-list; by default no non-public address is let through).
    Schedules declared in code are not resolved when they are synced: their
    URLs come from the code, and their sends are checked like every other.
    ``secret_names`` are the settings' secrets, which a header value
    ``secret:NAME`` may reference; a literal credential (``Authorization``,
    ``Proxy-Authorization``, ``Cookie``, a URL's user information) is refused
    on every save, the sync of schedules declared in code included.
    ``run_now_per_minute`` bounds how often one actor may ``run_now`` (any
    schedule) in a minute, counted from the audit (``RunNowLimited`` past
    it); None: no bound.  Fire times count from the database server's clock,
    read in each change's transaction (``outboxkit.storage.database_time``);
    a ``ManualClock`` as ``clock`` stands in for it in tests.
    """

    def __init__(
        self,
        engine: Engine | Transactions,
        *,
        clock: Clock | None = None,
        jobs: Collection[str] = (),
        outboxes: Iterable[type[Outbox]] = (),
        reserved_names: Callable[[str], str | None] | None = None,
        url_guard: UrlGuard | None = None,
        run_now_per_minute: int | None = None,
        secret_names: Collection[str] = (),
    ) -> None:
        self.secret_names = frozenset(secret_names)
        self.engine = engine
        self.run_now_per_minute = run_now_per_minute
        self.url_guard = url_guard if url_guard is not None else UrlGuard()
        self.reserved_names = reserved_names
        self.clock = DatabaseTime(clock)  # fire times count from the database server's clock (a ManualClock in tests)
        self.jobs = frozenset(jobs)
        self.request_outboxes = {
            outbox.__outbox__.job_name: outbox for outbox in outboxes if issubclass(outbox, ScheduledRequestOutbox)
        }

    # -- reading -------------------------------------------------------------

    def get(self, name: str) -> Schedule:
        with self.engine.connect() as connection:
            return schedule_of(self._row(connection, name, lock=False))

    def list(self) -> list[Schedule]:
        """Every schedule, by name (``page`` reads them a page at a time)."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(schedules).order_by(schedules.c.name)).mappings().all()
        return [schedule_of(row) for row in rows]

    def page(self, *, after: str | None = None, before: str | None = None, limit: int) -> Sequence[Schedule]:
        """Up to ``limit`` schedules in name order: the first ones, those after ``after`` or those before ``before``.

        A keyset read on the unique index of ``name``: a page deep in the list
        costs what the first one costs.  The rows come in name order either way.
        """
        statement = select(schedules)
        if before is not None:
            statement = statement.where(schedules.c.name < before).order_by(schedules.c.name.desc())
        else:
            if after is not None:
                statement = statement.where(schedules.c.name > after)
            statement = statement.order_by(schedules.c.name)
        with self.engine.connect() as connection:
            rows = connection.execute(statement.limit(limit)).mappings().all()
        found = [schedule_of(row) for row in rows]
        return found[::-1] if before is not None else found

    # -- changing ------------------------------------------------------------

    def create(self, definition: ScheduleDefinition, *, actor: str) -> Schedule:
        """Insert a new schedule; a name that exists is refused (``field == "name"``)."""
        self._check(definition)
        self._check_url(definition)
        with self.engine.begin() as connection:
            statement = (
                insert(schedules)
                .values(self._new_row(connection, definition, defined_in="api", actor=actor))
                .on_conflict_do_nothing(index_elements=["name"])
                .returning(*schedules.c)
            )
            row = connection.execute(statement).mappings().first()
            if row is None:
                raise InvalidScheduleError("name", f"a schedule named {definition.name!r} exists; edit it instead")
            self._changed(connection, "create", actor=actor, before=None, after=row)
        return schedule_of(row)

    def replace(self, definition: ScheduleDefinition, *, actor: str) -> Schedule:
        """Edit the schedule named ``definition.name`` to be ``definition``; one declared in code is refused
        (``ScheduleDeclaredInCode``): change it in the code."""
        self._check(definition)
        self._check_url(definition)
        with self.engine.begin() as connection:
            current = self._row(connection, definition.name, lock=True)
            self._refuse_if_declared_in_code(current, action="edit")
            row = self._write(connection, current, definition, actor=actor, action="edit")
        return schedule_of(row)

    def set_enabled(self, name: str, enabled: bool, *, actor: str) -> Schedule:
        """Enable or disable a schedule; enabling it again counts its next fire time from now."""
        with self.engine.begin() as connection:
            current = self._row(connection, name, lock=True)
            definition = definition_from_row(current)
            changed = replace(definition, enabled=enabled)
            row = self._write(connection, current, changed, actor=actor, action="enable" if enabled else "disable")
        return schedule_of(row)

    def run_now(self, name: str, *, actor: str) -> Schedule:
        """Make the schedule due now: one occurrence at this instant, then its trigger's own.

        ``enabled`` is left as it is: a disabled schedule runs this one
        occurrence (``run_now_pending`` lets the claim take it) and stays
        disabled.
        """
        with self.engine.begin() as connection:
            now = self.clock.read(connection)
            self._check_run_now_limit(connection, actor, now)
            current = self._row(connection, name, lock=True)
            statement = (
                update(schedules)
                .where(schedules.c.name == name)
                .values(next_run_at=now, run_now_pending=True, changed_at=now, changed_by=actor)
                .returning(*schedules.c)
            )
            row = connection.execute(statement).mappings().one()
            self._changed(connection, "run_now", actor=actor, before=current, after=row)
        return schedule_of(row)

    def delete(self, name: str, *, actor: str) -> None:
        """Delete a schedule; its run history stays.  A run in progress finishes and is recorded.

        One declared in code is refused (``ScheduleDeclaredInCode``): remove its declaration, or disable it.
        """
        with self.engine.begin() as connection:
            current = self._row(connection, name, lock=True)
            self._refuse_if_declared_in_code(current, action="delete")
            connection.execute(delete(schedules).where(schedules.c.name == name))
            self._changed(connection, "delete", actor=actor, before=current, after=None)

    def sync_from_code(
        self,
        definitions: Iterable[ScheduleDefinition],
        *,
        actor: str = "code",
        remove_missing: bool = False,
        origins: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """Write the schedules defined in code: insert new ones, update changed ones, keep their state.

        ``origins`` says where the code declares each one (``module:line``
        by name; the kit's start passes it), shown when an edit is refused.
        ``remove_missing`` also deletes every row defined in code that
        ``definitions`` no longer holds (audited as ``sync``; its run history
        stays); rows made through the API are never touched.  Returns how
        many were inserted, updated, left unchanged and removed.
        """
        definitions = list(definitions)
        origins = origins or {}
        counts = {"inserted": 0, "updated": 0, "unchanged": 0, "removed": 0}
        for definition in definitions:
            self._check(definition, past_allowed=True)
            with self.engine.begin() as connection:
                locked = select(schedules).where(schedules.c.name == definition.name).with_for_update()
                current = connection.execute(locked).mappings().first()
                if current is None:
                    definition.check_not_past(self.clock.now())
                    values = self._new_row(connection, definition, defined_in="code", actor=actor)
                    values["declared_at"] = origins.get(definition.name)
                    # Processes that start together sync the same new schedule: one inserts, the
                    # others wait for its commit on the unique name and then compare with its row.
                    statement = (
                        insert(schedules).values(values).on_conflict_do_nothing(index_elements=["name"])
                        .returning(*schedules.c)
                    )
                    row = connection.execute(statement).mappings().first()
                    if row is not None:
                        self._changed(connection, "sync", actor=actor, before=None, after=row)
                        counts["inserted"] += 1
                        continue
                    current = connection.execute(locked).mappings().one()
                # An operator's enable/disable outlives a deploy; the rest of the definition is the code's.
                wanted = replace(definition, enabled=current["enabled"])
                origin = origins.get(definition.name)
                if (wanted == definition_from_row(current) and current["defined_in"] == "code"
                        and current["declared_at"] == origin):
                    counts["unchanged"] += 1
                    continue
                self._write(connection, current, wanted, actor=actor, action="sync", defined_in="code", declared_at=origin)
                counts["updated"] += 1
        if remove_missing:
            counts["removed"] = self._remove_code_rows_except({definition.name for definition in definitions}, actor=actor)
        return counts

    def _remove_code_rows_except(self, names: Collection[str], *, actor: str) -> int:
        """Delete the rows defined in code whose names are not in ``names``, each audited; how many."""
        statement = (
            select(schedules)
            .where(schedules.c.defined_in == "code", schedules.c.name.not_in(list(names)))
            .order_by(schedules.c.name)  # every process locks them in one order: no deadlock between two syncs
            .with_for_update()
        )
        with self.engine.begin() as connection:
            rows = connection.execute(statement).mappings().all()
            for row in rows:
                connection.execute(delete(schedules).where(schedules.c.id == row["id"]))
                self._changed(connection, "sync", actor=actor, before=row, after=None)
        return len(rows)

    # -- internals -----------------------------------------------------------

    def _check(self, definition: ScheduleDefinition, *, past_allowed: bool = False) -> None:
        reserved = self.reserved_names(definition.name) if self.reserved_names is not None else None
        if reserved is not None:
            raise InvalidScheduleError("name", reserved)
        target = definition.target
        if isinstance(target, JobTarget) and target.job not in self.jobs:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise InvalidScheduleError("target.job", f"no job {target.job!r} is registered in code (registered: {known})")
        if isinstance(target, HttpTarget) and target.outbox not in self.request_outboxes:
            known = ", ".join(sorted(self.request_outboxes)) or "none"
            raise InvalidScheduleError(
                "target.outbox", f"no ScheduledRequestOutbox with job_name {target.outbox!r} is registered (registered: {known})"
            )
        if isinstance(target, HttpTarget):
            try:
                self.url_guard.parse(target.url)  # the scheme and no credential in the URL; no lookup
            except UnsafeUrlError as exc:
                raise InvalidScheduleError("target.url", str(exc)) from None
            problem = credential_problem(target.headers, self.secret_names)
            if problem is not None:
                raise InvalidScheduleError("target.headers", problem)
        if not past_allowed:
            definition.check_not_past(self.clock.now())

    @staticmethod
    def _refuse_if_declared_in_code(current: RowMapping, *, action: str) -> None:
        if current["defined_in"] == "code":
            raise ScheduleDeclaredInCode(current["name"], current["declared_at"], action=action)

    def _check_run_now_limit(self, connection: Connection, actor: str, now: datetime) -> None:
        limit = self.run_now_per_minute
        if limit is None:
            return
        connection.execute(_LOCK_ACTOR, {"actor": actor})
        recent = connection.execute(_RECENT_RUN_NOWS, {"actor": actor, "since": now - timedelta(minutes=1)}).scalars().all()
        if len(recent) >= limit:
            frees_at = recent[len(recent) - limit] + timedelta(minutes=1)  # when the oldest counted call leaves the minute
            raise RunNowLimited(actor, limit, max(1, math.ceil((frees_at - now).total_seconds())))

    def _check_url(self, definition: ScheduleDefinition) -> None:
        """Refuse an HTTP target whose URL the guard does not let through (``field == "target.url"``)."""
        if isinstance(definition.target, HttpTarget):
            try:
                self.url_guard.check(definition.target.url)
            except UnsafeUrlError as exc:
                raise InvalidScheduleError("target.url", str(exc)) from None

    def _new_row(
        self, connection: Connection, definition: ScheduleDefinition, *, defined_in: str, actor: str
    ) -> dict[str, Any]:
        now = self.clock.read(connection)
        return {
            **definition_values(definition),
            "next_run_at": definition.trigger.first_at_or_after(now),
            "defined_in": defined_in,
            "created_at": now,
            "created_by": actor,
            "changed_at": now,
            "changed_by": actor,
        }

    def _row(self, connection: Connection, name: str, *, lock: bool) -> RowMapping:
        statement = select(schedules).where(schedules.c.name == name)
        row = connection.execute(statement.with_for_update() if lock else statement).mappings().first()
        if row is None:
            raise UnknownScheduleError(f"no schedule named {name!r}")
        return row

    def _write(
        self,
        connection: Connection,
        current: RowMapping,
        definition: ScheduleDefinition,
        *,
        actor: str,
        action: str,
        defined_in: str | None = None,
        declared_at: str | None = None,
    ) -> RowMapping:
        """Overwrite the locked row ``current`` with ``definition``; recompute next_run_at if the trigger changed
        or the schedule is enabled again.  ``defined_in`` (the sync) also sets where the code declares it."""
        now = self.clock.read(connection)
        before = definition_from_row(current)
        next_run_at = current["next_run_at"]
        if before.trigger != definition.trigger or (definition.enabled and not before.enabled):
            # Strictly after now: an occurrence at this very instant may have just been fired by the old trigger.
            next_run_at = definition.trigger.first_after(now)
        values = {
            **definition_values(definition),
            "next_run_at": next_run_at,
            "changed_at": now,
            "changed_by": actor,
            "defined_in": defined_in or current["defined_in"],
        }
        if defined_in is not None:
            values["declared_at"] = declared_at
        if action == "disable":  # the operator's latest word: a "run now" not fired yet is cancelled too
            values["run_now_pending"] = False
        statement = update(schedules).where(schedules.c.id == current["id"]).values(values).returning(*schedules.c)
        row = connection.execute(statement).mappings().one()
        self._changed(connection, action, actor=actor, before=current, after=row)
        return row

    def _changed(
        self, connection: Connection, action: str, *, actor: str, before: RowMapping | None, after: RowMapping | None
    ) -> None:
        """Audit the change and wake every runner, in the change's transaction."""
        name = (after or before)["name"]  # type: ignore[index]
        audit = {
            "at": self.clock.now(),
            "actor": actor,
            "schedule": name,
            "action": action,
            "before": snapshot_of(before),
            "after": snapshot_of(after),
        }
        connection.execute(insert(schedule_audit).values(audit))
        connection.execute(_NOTIFY, {"channel": CHANNEL, "name": name})
