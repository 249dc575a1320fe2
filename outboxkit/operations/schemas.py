"""The admin's data: what the JSON API returns and the pages render.

These pydantic models are the documented shapes of the API (they become its
OpenAPI schema) and the values the service hands to the templates, so the two
views never disagree.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, computed_field

from outboxkit.storage.row_filter import RowFilter, utc_moment  # the filter the queries apply, shown as it was applied

__all__ = [
    "RowFilter",  # re-exported: the admin and the CLI name the filter through this layer
    "utc_moment",
    "ActionResult",
    "AttemptModel",
    "AuditEntry",
    "AuditPage",
    "ChartModel",
    "ChartWindow",
    "ControlResult",
    "EmptyRequest",
    "FilterMoment",
    "HeldByDestination",
    "FilterText",
    "FoundRow",
    "IdsRequest",
    "JobEntry",
    "JobRunsView",
    "JobsView",
    "LeaderModel",
    "MatchOutcome",
    "MatchRequest",
    "MinuteModel",
    "Overview",
    "OutboxCounts",
    "OutboxOverview",
    "PayloadFieldModel",
    "RowDetailModel",
    "RowOrderingModel",
    "RowId",
    "RowPage",
    "RowSummaryModel",
    "RunModel",
    "SkippedRow",
    "StatusCount",
]

MAX_ROW_ID = 2**63 - 1
MAX_BULK_IDS = 500
MAX_FILTER_LENGTH = 200

Status = Literal["pending", "done", "stuck", "discarded"]
STATUS_VALUES = ("stuck", "pending", "done", "discarded")  # the order of the tabs
# Request bodies are strict: only a JSON integer is an id (not "1", 1.0 or true)
# and only JSON true/false is a boolean (not "no", "off", "0" or 0).
RowId = Annotated[int, Field(strict=True, ge=1, le=MAX_ROW_ID, description="A row id (bigint, 1 to 2^63-1), a JSON integer.")]


def _plain_text(value: str | None) -> str | None:
    """Filters are data; refuse what PostgreSQL cannot store as text (NUL, lone surrogates)."""
    if value is None:
        return None
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return value or None


FilterText = Annotated[
    str | None,
    Field(max_length=MAX_FILTER_LENGTH, description="Case-insensitive substring of last_error; %, _ and \\ match themselves."),
    AfterValidator(_plain_text),
]
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _iso_8601_only(value: object) -> object:
    """Pydantic would read a number as seconds since 1970 (``0.5``, ``20300101``); a filter's time is ISO 8601 only."""
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise ValueError("must be an ISO 8601 time like 2030-01-01T12:00:00Z (numbers such as epoch seconds are refused)")
    return value


def _in_utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else utc_moment(moment)


# A time filter of the JSON API: ISO 8601 (no offset: UTC), normalised to UTC (``utc_moment``).
FilterMoment = Annotated[datetime | None, BeforeValidator(_iso_8601_only), AfterValidator(_in_utc)]
StatusCode = Annotated[int | None, Field(strict=True, ge=100, le=599, description="Exact last HTTP status code.")]


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class RunModel(_Model):
    """One recorded scheduler run (``outboxkit_job_runs``)."""

    job_id: str
    job_name: str
    scheduled_for: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: str = Field(description="running, ok, error or abandoned (its scheduler died mid-run)")
    counts: dict[str, Any]
    error: str | None
    leader: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration_seconds(self) -> float | None:
        """How long the run took; null while it runs (or when it was abandoned)."""
        return (self.finished_at - self.started_at).total_seconds() if self.finished_at else None


class LeaderModel(_Model):
    """A session holding the kit's election lock (its advisory key, in this database), from pg_locks + pg_stat_activity."""

    host: str | None = Field(
        description="The leader's host, from its application_name outboxkit-leader:<host>:<pid>; null when not visible."
    )
    pid: int | None = Field(description="The leader process id on its host, from its application_name.")
    backend_pid: int = Field(description="The PostgreSQL backend pid of the lock connection.")
    application_name: str | None
    since: datetime | None


class OutboxCounts(_Model):
    pending: int = Field(description="Pending rows (including those in flight); an estimate when pending_estimated is true.")
    pending_estimated: bool = Field(
        description="True past 100,000 pending rows: pending is then the due index's row estimate, not a count."
    )
    in_flight: int = Field(description="Exact count of pending rows a drain holds now (claimed_until in the future).")
    stuck: int = Field(description="Stuck rows; an estimate when stuck_estimated is true.")
    stuck_estimated: bool = Field(
        description="True past 100,000 stuck rows: stuck is then the stuck index's row estimate, not a count."
    )
    discarded: int = Field(
        default=0,
        description="Rows a person discarded: kept, never sent, not stuck; at most 100,000 counted (then "
        "discarded_estimated is true and this is a lower bound).",
    )
    discarded_estimated: bool = Field(default=False, description="True past 100,000 discarded rows (a lower bound).")
    done: int = Field(description="Delivered rows; an estimate when done_estimated is true.")
    done_estimated: bool = Field(
        description="True when done comes from the planner's row estimate (pg_class.reltuples) instead of a count."
    )
    held_by_order: int | None = Field(
        default=None,
        description="With an ordering key: pending rows waiting behind an earlier row of their key (not due until it "
        "is delivered or skipped; counted in pending). Null for an outbox without an ordering key.",
    )
    held_by_order_estimated: bool = Field(
        default=False,
        description="True when pending is an estimate, or more than 1,000 keys have undelivered rows (the count walks "
        "the first 1,000 keys; held_by_order is then an upper bound).",
    )


class MinuteModel(_Model):
    """One minute of an outbox (``outboxkit_outbox_minutes``), summed over every drainer."""

    minute: datetime = Field(description="The minute's start (UTC).")
    delivered: int = Field(description="Attempts that delivered.")
    failed: int = Field(description="Attempts that failed (retried or stuck).")
    stuck: int = Field(description="Attempts that left the row stuck.")
    pending: int | None = Field(description="Pending rows when the minute was sampled; null if nobody sampled it.")
    due: int | None = Field(
        description="Due rows (the backlog) when sampled; with an ordering key, not the rows held behind their key's head."
    )
    oldest_due_seconds: float | None = Field(description="Age of the oldest due row when sampled.")


ChartWindow = Literal["1h", "24h", "7d"]


class ChartModel(_Model):
    """An outbox's figures over a chart window, cut into buckets (``outboxkit.operations.charts.WINDOWS``)."""

    window: ChartWindow = Field(description="How far back: the last hour, day or week.")
    bucket_seconds: int = Field(description="Each bucket's length: 60 (1h), 900 (24h) or 7200 (7d).")
    buckets: list[MinuteModel] = Field(
        description="Oldest first; minute is the bucket's newest minute. Deliveries and failures are summed over the "
        "bucket; pending, due and oldest_due_seconds are its peak sample."
    )


class HeldByDestination(_Model):
    """A destination that keeps rows from the claim now (open, half-open, disabled, or slowed by a Retry-After)."""

    outbox: str
    destination: str
    state: Literal["disabled", "open", "half_open", "slowed"]
    waiting_rows: int = Field(description="Pending rows it holds back, counted up to 10,000 (see waiting_rows_at_least).")
    waiting_rows_at_least: bool
    since: datetime | None = Field(description="When it opened or was disabled; null for a destination only slowed.")
    until: datetime | None = Field(
        description="When its rows may be claimed again (its probe, the end of a slow-down); null while disabled."
    )
    last_error: str | None
    last_status_code: int | None


class OutboxOverview(_Model):
    name: str = Field(description="The outbox's job_name.")
    table: str
    counts: OutboxCounts
    oldest_due_at: datetime | None = Field(
        description="next_attempt_at of the oldest due pending row a drain could claim (with an ordering key, rows held "
        "behind their key's head are not due)."
    )
    oldest_due_age_seconds: float | None
    drain_job_id: str
    last_drain: RunModel | None = Field(description="The last recorded run of this outbox's drain job (the heartbeat).")
    held_by_destination: int = Field(
        default=0,
        description="Pending rows its destinations hold back now (open, half-open, disabled, slowed); counted in "
        "pending, never due while held. Each destination counts up to 10,000 (see held_by_destination_at_least).",
    )
    held_by_destination_at_least: bool = False
    paused: bool = Field(default=False, description="An operator paused this outbox's drains (every process).")
    paused_by: str | None = None
    paused_at: datetime | None = None
    last_hour: list[MinuteModel] | None = Field(
        default=None,
        description="With charts=true and window=1h: the last 60 minutes, oldest first (delivery, failures, backlog, "
        "oldest due age).",
    )
    chart: ChartModel | None = Field(default=None, description="With charts=true: the chart window's buckets.")


class Overview(_Model):
    generated_at: datetime
    leader: LeaderModel | None
    leaders: list[LeaderModel] = Field(description="Every session holding the lock; more than one would be a bug.")
    outboxes: list[OutboxOverview]
    held_back: list[HeldByDestination] = Field(
        default_factory=list,
        description="Every destination holding rows back now, of every outbox: disabled first, then open, half-open "
        "and slowed, the most rows first within each.",
    )


class StatusCount(_Model):
    status: Status
    count: int
    at_least: bool = Field(description="The count stopped at its cap (10,000 under a filter): there are at least this many.")
    estimated: bool = Field(description="From the planner's estimate (done rows of a big table, without a filter).")


class RowSummaryModel(_Model):
    id: int
    status: Status
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None = Field(description="Cut to 200 characters in lists; whole in the row detail.")
    last_error_truncated: bool
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    claimed_until: datetime | None
    held: bool = Field(description="A drain holds the row (pending, claimed_until in the future); actions refuse it.")
    in_backoff: bool = Field(description="Pending, not held, next attempt in the future: retry-now applies.")


class RowPage(_Model):
    outbox: str
    status: Status
    filter: RowFilter
    limit: int
    rows: list[RowSummaryModel]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last page.")
    previous_cursor: str | None = Field(default=None, description="Pass as cursor for the previous page; null on the first.")
    counts: list[StatusCount] | None = Field(
        default=None, description="Each status's count under the same filter (with counts=true)."
    )


class FoundRow(_Model):
    """A search hit: the outbox and the row."""

    outbox: str
    row: RowSummaryModel


class PayloadFieldModel(_Model):
    name: str
    type: str
    text: str | None = Field(description="The value as PostgreSQL text, cut to the preview size.")
    length: int | None = Field(description="The full length of the value as text.")
    truncated: bool


class AttemptRequestModel(_Model):
    """What an HTTP attempt sent, redacted: signatures, credentials and secrets' values as ``[redacted]``."""

    method: str
    url: str = Field(description="The URL sent to: user information as ***, credential-looking query values redacted.")
    headers: list[tuple[str, str]] = Field(description="The request headers as sent (at most 64), secrets redacted.")
    body_size: int = Field(description="Bytes of the request body.")
    body_sha256: str | None = Field(description="SHA-256 of the request body, hex; null without a body.")
    body: str | None = Field(
        description="The body's first attempt_body_bytes as text; null unless that setting is above 0 (off by default)."
    )
    body_truncated: bool = Field(description="Whether the body kept is shorter than the body sent.")


class AttemptResponseModel(_Model):
    """What came back: the status, a few headers, the first bytes of the body."""

    status: int
    headers: list[tuple[str, str]] = Field(
        description="Selected headers: content-type, content-length, retry-after, location and request ids."
    )
    body: str = Field(description="The body's first 1024 bytes as text (none for an HTTP target unless it asks).")
    body_size: int | None = Field(description="Bytes of the whole body read.")
    body_truncated: bool


class AttemptModel(_Model):
    """One delivery attempt of a row (``outboxkit_attempts``), or the marker a reset left."""

    attempt: int = Field(
        description="The attempt's number, counted across resets; for a reset marker, the number reached before it."
    )
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    outcome: Literal["done", "retry", "stuck", "lost", "reset"] = Field(
        description=(
            "What the attempt decided; lost: the row was reset or claimed again while it was sent; "
            "reset: not an attempt, the marker of a reset (or replay) of the row."
        )
    )
    status_code: int | None
    error: str | None = Field(description="The first 500 characters of the attempt's error.")
    sender: str = Field(description="host:pid of the process that sent it; for a reset marker, who reset the row.")
    request: AttemptRequestModel | None = Field(
        default=None, description="What was sent (HTTP attempts recorded since the kit's migration outboxkit_0019)."
    )
    response: AttemptResponseModel | None = Field(default=None, description="What came back; null when no answer came.")


class RowOrderingModel(_Model):
    """A row's place in its ordering key (outboxes with ``ordering_key``; docs/destinations.md, "Ordered delivery")."""

    key: str | None = Field(description="The row's ordering key as text; null: the row is unordered.")
    head: bool = Field(description="Whether it is its key's head, the row the key's next delivery waits for.")
    head_id: int | None = Field(description="Its key's head (itself, if head); null when the key has none left.")
    waiting: int = Field(description="Rows of its key behind it not yet delivered (counted up to waiting_cap + 1).")
    waiting_cap: int
    skipped: bool = Field(description="A person skipped it: it stays stuck and no longer holds its key.")


class RowDetailModel(RowSummaryModel):
    outbox: str
    idempotency_key: uuid.UUID
    claim_token: uuid.UUID | None
    ordering: RowOrderingModel | None = Field(default=None, description="Null unless the outbox orders by a key.")
    payload: list[PayloadFieldModel] = Field(description="The application's own columns.")
    attempt_history: list[AttemptModel] = Field(
        description=(
            "The row's recorded attempts, newest first (at most 100; kept attempt_history_days), with the markers "
            "of its resets (outcome reset)."
        )
    )


class IdsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[RowId] = Field(min_length=1, max_length=MAX_BULK_IDS, description=f"1 to {MAX_BULK_IDS} row ids.")


class MatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_contains: FilterText = None
    status_code: StatusCode = None
    dry_run: bool = Field(
        default=True, strict=True, description="Count and sample only; nothing changes. A JSON boolean; defaults to true."
    )


class SkippedRow(_Model):
    id: int
    reason: str


class ActionResult(_Model):
    action: Literal["reset", "retry_now", "skip", "discard"]
    outbox: str
    changed: int
    changed_ids: list[int]
    skipped: list[SkippedRow] = Field(description="Listed rows left as they were, and why (idempotent repeats).")
    audit_id: int | None = Field(description="The audit record; null when nothing changed.")


class ControlResult(_Model):
    """What pause, resume or drain now did."""

    action: Literal["pause", "resume", "drain_now"]
    outbox: str
    changed: bool = Field(description="False when the outbox already was in the asked state (nothing recorded).")
    paused: bool = Field(description="Whether the outbox's drains are paused now.")
    due_rows: int | None = Field(
        description="drain_now: the rows due when the drains were woken, counted up to 10,000 (see due_rows_at_least)."
    )
    due_rows_at_least: bool = Field(default=False, description="due_rows stopped at its cap: at least that many were due.")
    audit_id: int | None


class EmptyRequest(BaseModel):
    """An action without parameters still takes a JSON body (``{}``): the API's CSRF guard."""

    model_config = ConfigDict(extra="forbid")


class MatchOutcome(_Model):
    outbox: str
    filter: RowFilter
    dry_run: bool
    matched: int = Field(
        description="Stuck rows matching the filter (before the reset, for a real run), counted up to 10,000."
    )
    matched_at_least: bool = Field(description="The count stopped at its cap (10,000): at least this many match.")
    sample_ids: list[int] = Field(description="Up to 20 of the matching ids, newest first.")
    changed: int = Field(description="Rows reset, over all batches.")
    batches: int = Field(description="Transactions the reset ran, each of at most 1,000 rows, committed and audited alone.")
    complete: bool = Field(
        description="False when the reset stopped before reaching every matching row (its time share or the admin's "
        "time limit ran out); the rows it reset stay reset. Run it again for the rest: it is idempotent."
    )
    audit_id: int | None = Field(description="The first batch's audit record; null when nothing changed.")
    audit_ids: list[int] = Field(description="Every batch's audit record.")


class AuditEntry(_Model):
    id: int
    at: datetime
    actor: str
    outbox: str
    action: str
    row_count: int
    row_ids: list[int]
    filter: dict[str, Any]


class AuditPage(_Model):
    entries: list[AuditEntry]
    next_cursor: str | None


class JobEntry(_Model):
    id: str
    name: str
    trigger: str | None = Field(description="As the job source gives it; null when listed from run history.")
    schedule: str | None = Field(description="The trigger in words with its timezone, e.g. 'every day at 02:00 (Europe/Berlin)'.")
    next_run_at: datetime | None
    last_run: RunModel | None
    failures: int = Field(description="Runs that failed (error or abandoned) among the kept history.")
    runs_kept: int = Field(description="Runs kept in the history (job_history_limit per job).")
    outbox: str | None = Field(description="For an outbox's drain job: the outbox's job_name.")
    paused: bool = Field(description="The outbox's drains are paused (drain jobs only).")
    paused_by: str | None = None
    paused_at: datetime | None = None


class JobRunsView(_Model):
    """One job's run history, newest first."""

    job_id: str
    name: str | None
    runs: list[RunModel]


class JobsView(_Model):
    source: Literal["job_source", "run_history"]
    source_error: str | None = Field(
        description="Why the job source failed, if it did (the list then falls back to run history)."
    )
    leader: LeaderModel | None
    leaders: list[LeaderModel]
    jobs: list[JobEntry]
