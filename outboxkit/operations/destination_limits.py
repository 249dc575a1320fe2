"""An operator's limits of one destination, for the admin and the CLI: read, set, clear, audited.

``DestinationLimitOperations`` (``service.destination_limits``) acts on the
kit's operator database, each change in one transaction with its audit entry
(``outboxkit_reset_audit``, action ``destination_limit``, or
``destination_limit_clear`` when no limit of an operator is left; the
destination's name and both limits before and after in ``filter``).  The
limits themselves and how the claim reads them are
``outboxkit.destinations.limits``'.

``set`` replaces both limits: a value of None is the outbox's own from code and
settings (so ``set(..., per_second=None, cap=None)`` clears them).  Bad values
(not a number, zero, negative, too large) are refused with
``InvalidValueError``; a destination the outbox does not know (no state, no
pending row, no rate bucket, no limits, not named in its rate limit) with
``UnknownDestinationError``; both change nothing.  A change that would change
nothing is not audited and says so.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from outboxkit.destinations.limits import (
    MAX_CAP,
    MAX_PER_SECOND,
    DestinationLimits,
    check_limits,
    is_known,
    limit_from_text,
    read_limits,
    write_limits,
)
from outboxkit.errors import UnknownDestinationError
from outboxkit.kit import OutboxKit
from outboxkit.model import Outbox
from outboxkit.operations.controls import record_audit
from outboxkit.operations.destinations import could_be_a_name

__all__ = [
    "DestinationLimitOperations",
    "DestinationLimitsModel",
    "DestinationLimitsRequest",
    "DestinationLimitsResult",
    "limit_from_text",
]

_UNKNOWN = "a destination's limits can be set once it has pending rows, a stored state or a rate limit in the outbox"


class DestinationLimitsRequest(BaseModel):
    """The limits of one destination; null (or left out) for the outbox's own."""

    model_config = ConfigDict(extra="forbid", strict=True)

    destination: str = Field(min_length=1, max_length=300, description="The destination's name, as listed.")
    per_second: float | None = Field(
        default=None, gt=0, le=MAX_PER_SECOND, description="Requests per second, across every process; null: the outbox's own."
    )
    cap: int | None = Field(
        default=None, ge=1, le=MAX_CAP, description="Most sends in flight at once, across every process; null: the outbox's own."
    )


class DestinationLimitsModel(BaseModel):
    """One destination's limits: an operator's, and the outbox's own that apply without them."""

    outbox: str
    destination: str
    per_second: float | None = Field(description="The operator's rate limit, requests per second; null: none.")
    cap: int | None = Field(description="The operator's cap on sends in flight (at all times); null: none.")
    default_per_second: float | None = Field(description="The outbox's own rate limit of it (code and settings); null: none.")
    default_cap: int = Field(description="The outbox's own cap, which holds only while it is suspect and others have due rows.")
    updated_by: str | None
    updated_at: datetime | None


class DestinationLimitsResult(BaseModel):
    action: Literal["destination_limit", "destination_limit_clear"]
    changed: bool = Field(description="False when the limits were already these; nothing was recorded then.")
    reason: str | None
    limits: DestinationLimitsModel
    audit_id: int | None


class DestinationLimitOperations:
    """Read and change the operator's limits of destinations over one kit (see the module docstring)."""

    def __init__(self, kit: OutboxKit) -> None:
        self.kit = kit

    def get(self, outbox_name: str, destination: str) -> DestinationLimitsModel:
        outbox = self.kit.outbox(outbox_name)  # UnknownOutboxError
        with self.kit.operator_database.connect() as connection:
            self._known(connection, outbox, destination)
            return _model(outbox, destination, read_limits(connection, outbox, destination))

    def set(
        self, outbox_name: str, destination: str, *, per_second: object, cap: object, actor: str
    ) -> DestinationLimitsResult:
        """Replace the destination's limits (None: the outbox's own); audited, and every drain woken on commit."""
        outbox = self.kit.outbox(outbox_name)
        rate, capped = check_limits(per_second, cap)  # InvalidValueError before anything is read
        now = self.kit.clock.now()
        with self.kit.operator_database.begin() as connection:
            self._known(connection, outbox, destination)
            before = read_limits(connection, outbox, destination, lock=True)
            after = DestinationLimits(per_second=rate, cap=capped, updated_by=actor, updated_at=now)
            action: Literal["destination_limit", "destination_limit_clear"] = (
                "destination_limit_clear" if after.empty else "destination_limit"
            )
            if (before.per_second, before.cap) == (after.per_second, after.cap):
                return DestinationLimitsResult(
                    action=action, changed=False, reason="its limits are these already",
                    limits=_model(outbox, destination, before), audit_id=None,
                )
            write_limits(connection, outbox, destination, after, now=now, actor=actor)
            details = {
                "destination": destination,
                "per_second_before": before.per_second, "cap_before": before.cap,
                "per_second_after": after.per_second, "cap_after": after.cap,
            }
            audit_id = record_audit(
                connection, actor=actor, outbox_name=outbox.__outbox__.job_name, action=action, ids=[],
                row_filter=details, row_count=0,
            )
        shown = DestinationLimits() if after.empty else after
        return DestinationLimitsResult(
            action=action, changed=True, reason=None, limits=_model(outbox, destination, shown), audit_id=audit_id
        )

    def clear(self, outbox_name: str, destination: str, *, actor: str) -> DestinationLimitsResult:
        """Back to the outbox's own limits (audited)."""
        return self.set(outbox_name, destination, per_second=None, cap=None, actor=actor)

    @staticmethod
    def _known(connection: Connection, outbox: type[Outbox], destination: str) -> None:
        if not could_be_a_name(destination) or not is_known(connection, outbox, destination):
            raise UnknownDestinationError(outbox.__outbox__.job_name, destination, [], why=_UNKNOWN)


def _model(outbox: type[Outbox], destination: str, limits: DestinationLimits) -> DestinationLimitsModel:
    options = outbox.__outbox__
    return DestinationLimitsModel(
        outbox=options.job_name,
        destination=destination,
        per_second=limits.per_second,
        cap=limits.cap,
        default_per_second=options.rate_limit.per_second_of(destination) if options.rate_limit is not None else None,
        default_cap=options.destination_cap,
        updated_by=limits.updated_by,
        updated_at=limits.updated_at,
    )
