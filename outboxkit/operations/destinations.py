"""Destinations for operators: every destination of every outbox with its state, and resume, disable, probe now.

The admin (JSON API and pages) and the CLI (``outboxkit destinations``) both
act through ``DestinationOperations``, on the kit's operator database (its own
small pool, a time budget per transaction).  The state lives in
``outboxkit_destinations`` (``outboxkit.destinations.store``); the rules are
``outboxkit.breaker``'s; the rows waiting are counted by
``outboxkit.destinations.views``.

A destination is listed once it has a state: at its first failure, or when a
person disabled it.  One that only ever succeeded has none; it is healthy.

Actions, each in one transaction with its audit entry (``outboxkit_reset_audit``,
actions ``destination_resume``, ``destination_disable``, ``destination_probe``,
with the destination's name and its status before and after in ``filter``):

* **resume**: healthy again, its failure run and any ``Retry-After`` slow-down
  forgotten, the rows it held back due now (every drain is woken on commit).
  The way out of ``disabled`` (a ``410 Gone``, or a person).
* **disable**: nothing is sent to it, not even a probe, until it is resumed;
  its waiting rows keep their attempts.
* **probe now**: an open breaker's cool-down ends now; the next row claimed
  goes as the probe (the drains are woken).  Only an ``open`` destination has
  a cool-down to end.

An unknown destination (no state in that outbox) is refused with
``UnknownDestinationError`` and nothing changes.  An action that would change
nothing (resume a healthy destination, disable a disabled one, probe one that
is not open) changes nothing, is not audited, and says why
(``changed: false``, ``reason``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from outboxkit.breaker import DESTINATION_NAME_LIMIT as NAME_LIMIT
from outboxkit.breaker import DestinationState, Status
from outboxkit.destinations.limits import is_known
from outboxkit.destinations.store import DestinationStore
from outboxkit.destinations.views import (
    DestinationView,
    destination_views,
    read_state,
    waiting_rows,
    waiting_until,
)
from outboxkit.errors import UnknownDestinationError
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.operations.controls import DUE_COUNT_CAP, record_audit
from outboxkit.storage.notify import notify_statement

__all__ = [
    "DestinationAction",
    "DestinationActionRequest",
    "DestinationActionResult",
    "DestinationModel",
    "DestinationOperations",
    "DestinationsView",
    "OutboxDestinations",
    "UnknownDestinationError",
]

# The admin and the CLI list at most this many destinations per outbox (those needing a person first).
MAX_LISTED = 1_000

DestinationAction = Literal["resume", "disable", "probe"]
DestinationStatus = Literal["healthy", "open", "half_open", "disabled"]


class DestinationModel(BaseModel):
    """One destination of one outbox, as operators see it."""

    model_config = ConfigDict(from_attributes=True)

    outbox: str
    name: str
    status: DestinationStatus
    failure_rate: float | None = Field(description="Failures among the outcomes of the current window (0 to 1); null before any.")
    window_successes: int
    window_failures: int
    window_started_at: datetime | None
    consecutive_failures: int
    last_error: str | None
    last_status_code: int | None
    last_failure_at: datetime | None
    last_success_at: datetime | None
    open_since: datetime | None = Field(
        description="When it opened or was disabled (kept through failed probes); null while healthy."
    )
    next_probe_at: datetime | None = Field(description="open: when the cool-down ends and the next row goes as the probe.")
    cool_down_seconds: float | None
    probe_row_id: int | None = Field(description="half_open: the row being sent as the probe.")
    slowed_until: datetime | None = Field(description="A Retry-After holds every row of it until then.")
    waiting_rows: int = Field(description="Pending rows it holds back, counted up to 10,000 (see waiting_rows_at_least).")
    waiting_rows_at_least: bool
    waiting_until: datetime | None = Field(
        description="When its waiting rows may be claimed again (its probe, the end of a slow-down); null when it holds none "
        "back or is disabled."
    )
    changed_by: str | None = Field(description="What last opened, disabled or resumed it.")
    stored: bool = Field(
        default=True,
        description="Whether it has a stored state; one without (it never failed) is healthy, and only its limits can change.",
    )


class OutboxDestinations(BaseModel):
    outbox: str
    breaker: bool = Field(description="Whether the outbox's circuit breaker is on (OutboxOptions.breaker).")
    destinations: list[DestinationModel]
    complete: bool = Field(description=f"False when the outbox has more than {MAX_LISTED:,} destinations (the first are listed).")


class DestinationsView(BaseModel):
    generated_at: datetime
    outboxes: list[OutboxDestinations]


class DestinationActionRequest(BaseModel):
    """The destination an action is for (its name, exactly as listed)."""

    model_config = ConfigDict(extra="forbid")

    destination: str = Field(min_length=1, max_length=300, description="The destination's name, as listed.")


class DestinationActionResult(BaseModel):
    action: DestinationAction
    outbox: str
    destination: str
    changed: bool = Field(description="False when there was nothing to do (see reason); nothing was recorded then.")
    reason: str | None = Field(description="Why nothing changed, when it did not.")
    status: DestinationStatus = Field(description="The destination's status now.")
    released_rows: int = Field(description="Rows it held back that may be claimed now (resume, probe now).")
    audit_id: int | None


class DestinationOperations:
    """Read and act on destinations over one kit (see the module docstring)."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit

    # -- reads ---------------------------------------------------------------

    def all(self) -> DestinationsView:
        """Every outbox's destinations, those that need a person first."""
        now = self.kit.clock.now()
        with self.kit.operator_database.connect() as connection:
            outboxes = [self._outbox_destinations(connection, outbox, now) for outbox in self.kit.outboxes]
        return DestinationsView(generated_at=now, outboxes=outboxes)

    def of_outbox(self, outbox_name: str) -> OutboxDestinations:
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError for a bad name
        with self.kit.operator_database.connect() as connection:
            return self._outbox_destinations(connection, outbox, self.kit.clock.now())

    def one(self, outbox_name: str, destination: str) -> DestinationModel:
        """One destination; one without a stored state is healthy (``stored: false``) if the outbox knows it otherwise
        (``outboxkit.destinations.limits.is_known``), else ``UnknownDestinationError``."""
        outbox = self.kit.outbox(outbox_name)
        now = self.kit.clock.now()
        with self.kit.operator_database.connect() as connection:
            if could_be_a_name(destination) and read_state(connection, outbox, destination) is None and is_known(
                connection, outbox, destination
            ):  # it never failed, but has rows, a rate or limits: healthy, with its limits to set
                state = DestinationState(outbox=outbox.__outbox__.job_name, destination=destination)
                return _model(DestinationView(state=state, waiting_rows=0, waiting_rows_at_least=False), now).model_copy(
                    update={"stored": False}
                )
            state = self._state(connection, outbox, destination)
            count = waiting_rows(connection, outbox, state, now=now, cap=DUE_COUNT_CAP)
        view = DestinationView(state=state, waiting_rows=min(count, DUE_COUNT_CAP), waiting_rows_at_least=count > DUE_COUNT_CAP)
        return _model(view, now)

    def listed(self, connection: Connection, outbox: type[Outbox]) -> list[DestinationModel]:
        """The outbox's destinations as the list shows them (the first ``MAX_LISTED``), on the caller's connection."""
        return self._outbox_destinations(connection, outbox, self.kit.clock.now()).destinations

    def _outbox_destinations(self, connection: Connection, outbox: type[Outbox], now: datetime) -> OutboxDestinations:
        views = destination_views(connection, outbox, now=now, cap=DUE_COUNT_CAP, limit=MAX_LISTED + 1)
        return OutboxDestinations(
            outbox=outbox.__outbox__.job_name,
            breaker=outbox.__outbox__.breaker is not None,
            destinations=[_model(view, now) for view in views[:MAX_LISTED]],
            complete=len(views) <= MAX_LISTED,
        )

    # -- actions -------------------------------------------------------------

    def resume(self, outbox_name: str, destination: str, *, actor: str) -> DestinationActionResult:
        """Healthy again, failure run and slow-down forgotten, its held rows due now."""
        outbox = self.kit.outbox(outbox_name)
        now = self.kit.clock.now()
        with self.kit.operator_database.begin() as connection:
            before = self._state(connection, outbox, destination, lock=True)
            if before.status == Status.HEALTHY.value and not before.consecutive_failures and not _slowed(before, now):
                return _unchanged("resume", before, "it is healthy: nothing holds its rows back")
            released = min(waiting_rows(connection, outbox, before, now=now, cap=DUE_COUNT_CAP), DUE_COUNT_CAP)
            after = DestinationStore(outbox).resume(connection, destination, now=now, actor=actor)
            assert after is not None  # the row is locked: it cannot have gone
            connection.execute(notify_statement(outbox))  # on commit: every drain claims them at once
            audit_id = self._audit(connection, outbox_name, "destination_resume", before, after, actor, rows=released)
        return _changed("resume", after, released, audit_id)

    def disable(self, outbox_name: str, destination: str, *, actor: str) -> DestinationActionResult:
        """Send nothing to it, not even a probe, until it is resumed; its rows wait with their attempts."""
        outbox = self.kit.outbox(outbox_name)
        now = self.kit.clock.now()
        with self.kit.operator_database.begin() as connection:
            before = self._state(connection, outbox, destination, lock=True)
            if before.status == Status.DISABLED.value:
                return _unchanged("disable", before, f"it is already disabled ({before.changed_by or 'by a person'})")
            after = DestinationStore(outbox).disable(connection, destination, now=now, actor=actor)
            audit_id = self._audit(connection, outbox_name, "destination_disable", before, after, actor)
        return _changed("disable", after, 0, audit_id)

    def probe(self, outbox_name: str, destination: str, *, actor: str) -> DestinationActionResult:
        """End an open breaker's cool-down now: the next row claimed goes as the probe."""
        outbox = self.kit.outbox(outbox_name)
        now = self.kit.clock.now()
        with self.kit.operator_database.begin() as connection:
            before = self._state(connection, outbox, destination, lock=True)
            if before.status != Status.OPEN.value:
                return _unchanged("probe", before, _why_no_probe(before))
            held = min(waiting_rows(connection, outbox, before, now=now, cap=DUE_COUNT_CAP), DUE_COUNT_CAP)
            after = DestinationStore(outbox).probe_now(connection, destination, now=now)
            assert after is not None  # locked and open: probe_now applies
            connection.execute(notify_statement(outbox))  # the held rows are due now: the drains claim, one probes
            audit_id = self._audit(connection, outbox_name, "destination_probe", before, after, actor, rows=held)
        return _changed("probe", after, held, audit_id)

    # -- plumbing ------------------------------------------------------------

    def _state(self, connection: Connection, outbox: type[Outbox], destination: str, *, lock: bool = False) -> DestinationState:
        state = read_state(connection, outbox, destination, lock=lock) if could_be_a_name(destination) else None
        if state is None:
            listed = destination_views(connection, outbox, now=self.kit.clock.now(), cap=0, limit=11)
            raise UnknownDestinationError(outbox.__outbox__.job_name, destination, [view.state.destination for view in listed])
        return state

    @staticmethod
    def _audit(
        connection: Connection,
        outbox_name: str,
        action: str,
        before: DestinationState,
        after: DestinationState,
        actor: str,
        *,
        rows: int = 0,
    ) -> int:
        """The action's entry: the destination and its status before and after; ``rows`` it released (the rows'
        ids are not listed: a destination may hold thousands)."""
        details = {"destination": after.destination, "status_before": before.status, "status_after": after.status}
        return record_audit(
            connection, actor=actor, outbox_name=outbox_name, action=action, ids=[], row_filter=details, row_count=rows
        )


def _slowed(state: DestinationState, now: datetime) -> bool:
    return state.slowed_until is not None and state.slowed_until > now


def _why_no_probe(state: DestinationState) -> str:
    if state.status == Status.HALF_OPEN.value:
        return f"a probe is in flight already (row {state.probe_row_id})"
    if state.status == Status.DISABLED.value:
        return "it is disabled: resume it to send to it again"
    return "it is healthy: there is no cool-down to end"


def _unchanged(action: DestinationAction, state: DestinationState, reason: str) -> DestinationActionResult:
    return DestinationActionResult(
        action=action, outbox=state.outbox, destination=state.destination, changed=False, reason=reason,
        status=state.status,  # type: ignore[arg-type]
        released_rows=0, audit_id=None,
    )


def _changed(action: DestinationAction, state: DestinationState, released: int, audit_id: int) -> DestinationActionResult:
    return DestinationActionResult(
        action=action, outbox=state.outbox, destination=state.destination, changed=True, reason=None,
        status=state.status,  # type: ignore[arg-type]
        released_rows=released, audit_id=audit_id,
    )


def _model(view: DestinationView, now: datetime) -> DestinationModel:
    state = view.state
    held = state.status in (Status.OPEN.value, Status.HALF_OPEN.value, Status.DISABLED.value)
    return DestinationModel(
        outbox=state.outbox,
        name=state.destination,
        status=state.status,  # type: ignore[arg-type]
        failure_rate=state.failure_rate,
        window_successes=state.window_successes,
        window_failures=state.window_failures,
        window_started_at=state.window_started_at,
        consecutive_failures=state.consecutive_failures,
        last_error=state.last_error,
        last_status_code=state.last_status_code,
        last_failure_at=state.last_failure_at,
        last_success_at=state.last_success_at,
        open_since=state.opened_at if held else None,
        next_probe_at=state.next_probe_at if state.status == Status.OPEN.value else None,
        cool_down_seconds=state.cool_down,
        probe_row_id=state.probe_row_id if state.status == Status.HALF_OPEN.value else None,
        slowed_until=state.slowed_until if _slowed(state, now) else None,
        waiting_rows=view.waiting_rows,
        waiting_rows_at_least=view.waiting_rows_at_least,
        waiting_until=waiting_until(state, now=now),
        changed_by=state.changed_by,
    )


def could_be_a_name(destination: str) -> bool:
    """Whether ``destination`` could name a stored destination: 1 to ``NAME_LIMIT`` characters PostgreSQL can
    hold as text (no NUL, no lone surrogate).  Any other name is unknown without asking the database."""
    if not 0 < len(destination) <= NAME_LIMIT or "\x00" in destination:
        return False
    try:
        destination.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
