"""The schedule pages' and the schedule API's data: what is sent to create or edit a schedule, and what is read back.

A request is JSON with strict types (``max_running`` is a JSON integer, not
``"1"``; ``enabled`` is ``true`` or ``false``, not ``"yes"``); what JSON
Schema cannot say (an IANA timezone, a cron field, a URL that is http(s), a
``once`` that is not past) is checked by ``outboxkit.schedules`` when
``ScheduleFields.definition`` builds the ``ScheduleDefinition``, and the
``InvalidScheduleError`` it raises names the field (``trigger.timezone``,
``trigger.fields.minute``, ``target.url``...).  The API answers it 422 with
that field as the error's ``loc``; the pages show it next to the field.

The read models are the API's OpenAPI schema and what the templates render,
so the two views never disagree (as ``outboxkit.operations.schemas``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from outboxkit.operations.schemas import JobEntry, LeaderModel
from outboxkit.schedules.definitions import MAX_RUNNING_LIMIT, HttpTarget, JobTarget, ScheduleDefinition, ScheduleTrigger
from outboxkit.storage.tables import RUN_OUTCOMES as RECORDED_OUTCOMES
from outboxkit.target_secrets import redact_headers, redact_url

__all__ = [
    "RUN_OUTCOMES",
    "SCHEDULE_NAME_PATTERN",
    "FireTimeModel",
    "ScheduleAction",
    "HttpTargetModel",
    "InternalJobModel",
    "InternalJobsView",
    "JobTargetModel",
    "ScheduleActionResult",
    "ScheduleAuditEntry",
    "ScheduleCreate",
    "ScheduleFields",
    "ScheduleHistoryPage",
    "ScheduleListView",
    "ScheduleModel",
    "ScheduleRunModel",
    "TriggerModel",
]

RUN_OUTCOMES = tuple(RECORDED_OUTCOMES)  # what a schedule's history may hold, for the pages' outcome filter
SCHEDULE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"
TriggerKind = Literal["cron", "every", "calendar_interval", "once"]
FieldValue = StrictInt | StrictFloat | StrictStr
ScheduleAction = Literal["create", "edit", "enable", "disable", "run_now", "delete"]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TriggerModel(_Request):
    """When it fires: the kind, its fields (JSON values) and an IANA timezone (see docs/schedules.md)."""

    kind: TriggerKind
    fields: dict[Annotated[str, Field(max_length=20)], FieldValue] = Field(
        default_factory=dict,
        max_length=10,
        description="cron: year, month, day, week, day_of_week, hour, minute, second; every: days, hours, minutes, "
        "seconds, start; calendar_interval: years, months, weeks, days, hour, minute, second, start; once: at.",
    )
    timezone: str = Field(default="UTC", max_length=64, description="An IANA timezone, e.g. Europe/Berlin.")


class JobTargetModel(_Request):
    """Run the Python job registered in code under ``job``."""

    kind: Literal["job"]
    job: str = Field(max_length=200)


class HttpTargetModel(_Request):
    """Send an HTTP request, enqueued into ``outbox`` (a ScheduledRequestOutbox's job_name) at each occurrence."""

    kind: Literal["http"]
    url: str = Field(description="An absolute http(s) URL.")
    outbox: str = Field(max_length=100)
    method: str = Field(default="POST", max_length=10)
    # No caps beyond the columns' own: these models also read back rows defined in code (the body cap bounds a request).
    headers: dict[str, StrictStr] = Field(default_factory=dict)
    body: Any = Field(default=None, description="The JSON body; null for none.")


Target = Annotated[JobTargetModel | HttpTargetModel, Field(discriminator="kind")]


class ScheduleFields(_Request):
    """A schedule's definition without its name: the body of an edit."""

    trigger: TriggerModel
    target: Target
    enabled: StrictBool = True
    misfire_grace_seconds: StrictInt = Field(
        default=300, description="An occurrence found due at most this late runs (once); older ones are recorded missed."
    )
    max_running: StrictInt = Field(
        default=1, description=f"Runs of a Python job holding a lease at once, across processes (1 to {MAX_RUNNING_LIMIT})."
    )
    rerun_if_abandoned: StrictBool = Field(
        default=False, description="The job is safe to run twice: a run whose process died is re-run once."
    )

    def definition(self, name: str) -> ScheduleDefinition:
        """The validated definition; ``InvalidScheduleError`` names the field at fault."""
        trigger = ScheduleTrigger(kind=self.trigger.kind, fields=self.trigger.fields, timezone=self.trigger.timezone)
        target: JobTarget | HttpTarget
        if isinstance(self.target, JobTargetModel):
            target = JobTarget(job=self.target.job)
        else:
            target = HttpTarget(
                url=self.target.url,
                outbox=self.target.outbox,
                method=self.target.method,
                headers=self.target.headers,
                body=self.target.body,
            )
        return ScheduleDefinition(
            name=name,
            trigger=trigger,
            target=target,
            enabled=self.enabled,
            misfire_grace_seconds=self.misfire_grace_seconds,
            max_running=self.max_running,
            rerun_if_abandoned=self.rerun_if_abandoned,
        )

    @classmethod
    def of(cls, definition: ScheduleDefinition) -> ScheduleFields:
        """The fields of ``definition`` as shown, and what an edit form starts from: a credential in its target
        is redacted (``outboxkit.target_secrets``), so saving it again asks for a secret reference instead."""
        target = definition.target
        target_model: JobTargetModel | HttpTargetModel
        if isinstance(target, JobTarget):
            target_model = JobTargetModel(kind="job", job=target.job)
        else:
            target_model = HttpTargetModel(
                kind="http", url=redact_url(target.url), outbox=target.outbox, method=target.method,
                headers=redact_headers(target.headers), body=target.body,
            )
        trigger = definition.trigger
        return cls(
            trigger=TriggerModel(kind=trigger.kind, fields=dict(trigger.fields), timezone=trigger.timezone),  # type: ignore[arg-type]
            target=target_model,
            enabled=definition.enabled,
            misfire_grace_seconds=definition.misfire_grace_seconds,
            max_running=definition.max_running,
            rerun_if_abandoned=definition.rerun_if_abandoned,
        )


class ScheduleCreate(ScheduleFields):
    """A new schedule: its unique name and its definition."""

    name: str = Field(
        pattern=SCHEDULE_NAME_PATTERN, description="1-200 letters, digits, '.', ':', '_' or '-', e.g. billing.nightly."
    )


class FireTimeModel(_Model):
    """One fire time: in UTC, in the schedule's timezone and in the viewer's (the same instant, three offsets)."""

    at: datetime
    local: datetime
    viewer: datetime


class ScheduleRunModel(_Model):
    """One recorded occurrence (``outboxkit_job_runs`` under the schedule's name)."""

    scheduled_for: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: str = Field(description="running, ok, error, enqueued (an HTTP target), missed or abandoned")
    counts: dict[str, Any]
    error: str | None
    holder: str = Field(description="The process that fired it: <host>:<pid>:<id>.")


class ScheduleModel(_Model):
    """A schedule row as an operator reads it."""

    name: str
    definition: ScheduleFields
    description: str = Field(description="The trigger in one line, e.g. cron(hour=3, minute=30) in Europe/Berlin.")
    next_run_at: datetime | None = Field(
        description="When it next fires (in the past when overdue); null once ended or while disabled."
    )
    next_fire_times: list[FireTimeModel] = Field(description="The next five fire times; none while disabled.")
    viewer_timezone: str
    last_run: ScheduleRunModel | None
    defined_in: str = Field(
        description="code (declared in the application's code and synced at every start: edit and delete are refused "
        "with 409, change it in the code; enable, disable and run now work) or api"
    )
    declared_at: str | None = Field(
        default=None, description="For a schedule defined in code: where the code declares it (module:line)."
    )
    created_at: datetime
    created_by: str
    changed_at: datetime
    changed_by: str


class InternalJobModel(JobEntry):
    """A job the elected leader runs, listed beside the schedules, read-only: it is registered in code, not a row."""

    internal: bool = Field(
        description="true: one of the kit's own jobs (its id starts with 'outboxkit.': the safety-net drain of an "
        "outbox, retention, partitions). false: an application job registered with the deprecated "
        "kit.scheduler.add_job; declare it with kit.schedules.add_job to make it a schedule."
    )
    read_only: Literal[True] = Field(
        default=True, description="Always true: it cannot be edited, disabled, run now or deleted from the admin."
    )


class InternalJobsView(_Model):
    """The jobs the elected leader runs (the kit's own, and any registered with the deprecated
    ``kit.scheduler.add_job``), read-only; each one's runs are at ``GET /api/schedules/_internal/{job_id}/runs``."""

    source: Literal["job_source", "run_history"] = Field(
        description="job_source: listed by the kit's scheduler registry (or the admin's job_source), with next runs; "
        "run_history: that listing failed, so the kit's own jobs are listed from the run history."
    )
    source_error: str | None = Field(description="Why the listing failed, if it did.")
    leader: LeaderModel | None = Field(description="The process that leads (runs these jobs) now, if any.")
    jobs: list[InternalJobModel]


class ScheduleListView(_Model):
    """One page of schedules in name order (keyset-paged both ways, as the rows of an outbox)."""

    generated_at: datetime
    viewer_timezone: str
    limit: int = Field(description="The page size asked for.")
    schedules: list[ScheduleModel] = Field(description="This page's schedules, by name.")
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last page.")
    previous_cursor: str | None = Field(description="Pass as cursor for the previous page; null on the first.")
    jobs: list[str] = Field(description="The job names a schedule may target here.")
    outboxes: list[str] = Field(description="The ScheduledRequestOutbox job names an HTTP target may name.")
    internal_jobs: InternalJobsView = Field(
        description="The jobs the elected leader runs, read-only and marked internal (on every page of the list)."
    )


class ScheduleHistoryPage(_Model):
    """One schedule's recorded occurrences, newest first."""

    name: str
    outcomes: list[str] | None
    runs: list[ScheduleRunModel]
    next_before: datetime | None = Field(description="Pass as before= for the next (older) page; null on the last page.")


class ScheduleAuditEntry(_Model):
    id: int
    at: datetime
    actor: str
    schedule: str
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class ScheduleActionResult(_Model):
    action: ScheduleAction
    name: str
    schedule: ScheduleModel | None = Field(description="The schedule after the action; null after delete.")
