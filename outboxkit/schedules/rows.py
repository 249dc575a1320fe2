"""A schedule row and its definition, both ways, and what the audit keeps of it.

``definition_values`` writes a ``ScheduleDefinition`` into the columns of ``outboxkit_schedules``;
``definition_from_row`` reads it back (the runner and the claims read rows with it);
``Schedule`` is a row as the store returns it.  ``redact_snapshot`` is what the audit and the
pages show of a row: credentials never in clear (``outboxkit.target_secrets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping

from outboxkit.schedules.definitions import HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.target_secrets import redact_headers, redact_url

__all__ = ["Schedule", "definition_from_row", "definition_values", "redact_snapshot", "schedule_of", "snapshot_of"]

@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A schedule row as read: its definition, when it next fires, and who created and changed it."""

    id: int
    definition: ScheduleDefinition
    next_run_at: datetime | None
    defined_in: str  # "code" (synced at start) or "api"
    declared_at: str | None = None  # for a schedule defined in code: where the code declares it ("module:line"), if known
    created_at: datetime
    created_by: str
    changed_at: datetime
    changed_by: str

    @property
    def name(self) -> str:
        return self.definition.name


def definition_values(definition: ScheduleDefinition) -> dict[str, Any]:
    """The row's columns that hold ``definition``."""
    target = definition.target
    values: dict[str, Any] = {
        "name": definition.name,
        "trigger_kind": definition.trigger.kind,
        "trigger_fields": dict(definition.trigger.fields),
        "timezone": definition.trigger.timezone,
        "enabled": definition.enabled,
        "misfire_grace_seconds": definition.misfire_grace_seconds,
        "max_running": definition.max_running,
        "rerun_if_abandoned": definition.rerun_if_abandoned,
        "job": None,
        "http_outbox": None,
        "http_method": None,
        "http_url": None,
        "http_headers": {},
        "http_body": None,
    }
    if isinstance(target, JobTarget):
        values.update(target_kind="job", job=target.job)
    else:
        values.update(
            target_kind="http",
            http_outbox=target.outbox,
            http_method=target.method,
            http_url=target.url,
            http_headers=dict(target.headers),
            http_body=target.body,
        )
    return values


def definition_from_row(row: RowMapping) -> ScheduleDefinition:
    """The definition a row holds, validated again (a row edited by hand in SQL is checked too)."""
    target: JobTarget | HttpTarget
    if row["target_kind"] == "job":
        target = JobTarget(job=row["job"])
    else:
        target = HttpTarget(
            url=row["http_url"],
            outbox=row["http_outbox"],
            method=row["http_method"],
            headers=row["http_headers"],
            body=row["http_body"],
        )
    return ScheduleDefinition(
        name=row["name"],
        trigger=ScheduleTrigger(kind=row["trigger_kind"], fields=row["trigger_fields"], timezone=row["timezone"]),
        target=target,
        enabled=row["enabled"],
        misfire_grace_seconds=row["misfire_grace_seconds"],
        max_running=row["max_running"],
        rerun_if_abandoned=row["rerun_if_abandoned"],
    )


def snapshot_of(row: RowMapping | None) -> dict[str, Any] | None:
    """A row as JSON for the audit (times as ISO 8601 strings; a credential in its target redacted)."""
    if row is None:
        return None
    return redact_snapshot(
        {key: value.isoformat() if isinstance(value, datetime) else value for key, value in row.items() if key != "id"}
    )


def redact_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A schedule row's audit snapshot as shown: the target's URL and headers redacted (``outboxkit.target_secrets``)."""
    shown = dict(snapshot)
    if isinstance(shown.get("http_url"), str):
        shown["http_url"] = redact_url(shown["http_url"])
    if isinstance(shown.get("http_headers"), dict):
        shown["http_headers"] = redact_headers(shown["http_headers"])
    return shown


def schedule_of(row: RowMapping) -> Schedule:
    return Schedule(
        id=row["id"],
        definition=definition_from_row(row),
        next_run_at=row["next_run_at"],
        defined_in=row["defined_in"],
        declared_at=row["declared_at"],
        created_at=row["created_at"],
        created_by=row["created_by"],
        changed_at=row["changed_at"],
        changed_by=row["changed_by"],
    )
