"""The kit's own tables: run history, reset audit, attempt history, paused outboxes.

They live in their own ``MetaData`` (``kit_metadata``) and ship as an Alembic
migration branch labelled ``outboxkit``; an application adds
``outboxkit:migrations/versions`` to its ``version_locations`` (see
docs/operations.md) and runs ``alembic upgrade heads``.

``outboxkit_job_runs`` records every scheduled run; its unique
(``job_id``, ``scheduled_for``) is the fence: a run whose fire time is
already recorded is skipped, so two processes that both believe they lead
cannot run the same occurrence twice.

``outboxkit_attempts`` holds every delivery attempt of every row (written
by the drain in batches, see ``outboxkit.storage.attempts``), kept for
``attempt_history_days``; it outlives a reset, so the reason a row got stuck
stays readable after it was sent again.  Its index on (``outbox``,
``finished_at``) serves the retention trim and the overview's charts.  Each
HTTP attempt keeps what it sent and got back (``request``, ``response``:
redacted and bounded, ``outboxkit.transports.exchange``); a reset of a row
writes a marker (outcome ``reset``), from which its attempts count on.

``outboxkit_outbox_minutes`` holds one row per outbox and minute for the
overview's charts: attempts that delivered, failed and got stuck (added by
every drainer as it writes its attempt history) and a sample of the backlog
(pending and due rows, the oldest due row's age) taken by the drainers once
a minute.  Kept as long as the attempt history.

``outboxkit_outbox_pauses`` lists the outboxes whose drains are paused (one
row each); every drainer reads it before claiming (``outboxkit.storage.pauses``).

``outboxkit_ordering_skips`` lists the rows a person skipped at the head of
their ordering key (one row per outbox and row id): each stays ``stuck`` in
its outbox and no longer holds back the rows behind it
(``outboxkit.storage.ordering``).

``outboxkit_destinations`` holds the state of each destination of each
outbox (one row per pair, created by its first recorded outcome): the
circuit breaker's status, its failure run, recent outcome counts, when it
opened, the next probe, the last error (``outboxkit.breaker`` for the
rules, ``outboxkit.destinations.store`` for the statements).
``outboxkit_destination_rates`` holds the token bucket of each destination
with a rate limit (``outboxkit.rate_limits``, ``outboxkit.storage.destination_claim``):
one row per (outbox, destination), created by its first send.
``outboxkit_destination_limits`` holds the limits an operator set on a
destination while the kit runs (a rate limit, a cap on sends in flight), which
replace the outbox's own for it until cleared (``outboxkit.destinations.limits``).

``outboxkit_schedules`` holds the schedules as rows (``outboxkit.schedules``):
the trigger as data (kind, JSON fields, IANA timezone; never pickled), the
target (a job registered in code by name, or an HTTP request as data and the
outbox that carries it), ``next_run_at``, misfire grace, running limit and
who created and changed it.  Its partial index on ``next_run_at`` serves the
claim of due rows.  ``outboxkit_schedule_leases`` holds one row per run of a
Python job in progress: its holder and an expiry the holder renews
(``outboxkit.schedules.leases``).  Their runs, misses and enqueued HTTP calls
are recorded in ``outboxkit_job_runs`` under the schedule's name.
``outboxkit_schedule_audit`` records every change to a schedule (who, when,
the action, the row before and after), written in the change's transaction.

``outboxkit_inbox`` is the receiving side's record of handled messages
(``outboxkit.inbox``): one row per (``source``, ``message_id``), inserted with
``ON CONFLICT DO NOTHING`` in the consumer's own transaction, so it commits
with the business write or not at all.  Its index on ``received_at`` serves
the retention that prunes it.  ``outboxkit_inbox_sources`` holds one row per
source with what the records cannot say: duplicates dropped and handler
failures (whose transactions rolled back), each with when it last happened.

``outboxkit_subscriptions`` holds the subscriptions of events
(``outboxkit.events``): an endpoint URL, event-type filters (exact names and
``invoice.*`` prefixes, matched by one overlap on their GIN index), an
optional tenant, the Standard Webhooks secrets that sign its deliveries,
custom headers, enabled or disabled with the reason, and who created and
changed it.  ``outboxkit_subscription_audit`` records every change to one
(its secrets counted, never copied).  ``outboxkit_events`` holds every
published event, delivered to anybody or not; ``outboxkit_event_types`` the
catalog of event types and their optional JSON Schemas.  The deliveries
themselves are an outbox of the kit's, ``outboxkit_event_deliveries``
(``outboxkit.events.deliveries``).

``outboxkit_wakeups`` holds a row per outbox channel while a wake-up is
pending, so inserts meanwhile do not notify (``outboxkit.storage.wakeups``).

One module, past 400 lines: the kit's whole schema in one ``MetaData``, which its migration branch and the
tests compare against as one; splitting it by subsystem is the next step once the subsystems own their migrations.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

__all__ = [
    "attempts",
    "destination_limits",
    "destination_rates",
    "destinations",
    "event_types",
    "events",
    "inbox",
    "inbox_sources",
    "job_runs",
    "kit_metadata",
    "outbox_minutes",
    "outbox_pauses",
    "outbox_wakeups",
    "ordering_skips",
    "reset_audit",
    "schedule_audit",
    "schedule_leases",
    "schedules",
    "subscription_audit",
    "subscriptions",
]

kit_metadata = MetaData()

# abandoned: its scheduler died mid-run; missed: a schedule's occurrence not run (found beyond its misfire
# grace, after downtime or a wait for a running slot); enqueued: a schedule's HTTP call written into its outbox.
RUN_OUTCOMES = ("running", "ok", "error", "abandoned", "missed", "enqueued")

job_runs = Table(
    "outboxkit_job_runs",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", String(200), nullable=False),
    Column("job_name", String(200), nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    Column("outcome", String(16), nullable=False, server_default=text("'running'")),
    Column("counts", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("error", Text),
    Column("leader", String(300), nullable=False),
    UniqueConstraint("job_id", "scheduled_for", name="uq_outboxkit_job_runs_occurrence"),
    CheckConstraint(
        "outcome IN ('running', 'ok', 'error', 'abandoned', 'missed', 'enqueued')", name="ck_outboxkit_job_runs_outcome"
    ),
    Index("ix_outboxkit_job_runs_job_started", "job_id", "started_at"),
)

# The fence kept apart from the capped history: per job (a schedule's name, or an elected job's id), every
# occurrence at or before ``fired_through`` counts as fired, since the trim of the run history moves it past the
# runs it deletes.  An occurrence after it is fenced by its own row in outboxkit_job_runs (uq_..._occurrence).
job_fences = Table(
    "outboxkit_job_fences",
    kit_metadata,
    Column("job_id", String(200), primary_key=True),
    Column("fired_through", DateTime(timezone=True), nullable=False),
)

reset_audit = Table(
    "outboxkit_reset_audit",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor", String(300), nullable=False),
    Column("outbox", String(100), nullable=False),
    Column("action", String(32), nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("row_ids", ARRAY(BigInteger), nullable=False, server_default=text("'{}'")),
    Column("filter", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    CheckConstraint(
        "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now', 'replay',"
        " 'destination_resume', 'destination_disable', 'destination_probe', 'skip', 'discard',"
        " 'destination_limit', 'destination_limit_clear')",
        name="ck_outboxkit_reset_audit_action",
    ),
    Index("ix_outboxkit_reset_audit_at", "at"),
)

# lost: the row was reset or re-claimed during the send; reset: a marker a reset (or a replay) writes, whose
# attempt is the number the row's attempts had reached (outboxkit.storage.reset_markers)
ATTEMPT_OUTCOMES = ("done", "retry", "stuck", "lost", "reset")

attempts = Table(
    "outboxkit_attempts",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("outbox", String(100), nullable=False),
    Column("row_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("outcome", String(8), nullable=False),
    Column("status_code", SmallInteger),
    Column("error", Text),
    Column("sender", String(300), nullable=False),
    # What an HTTP attempt sent and got back, redacted and bounded (outboxkit.storage.attempts.request_json).
    Column("request", JSONB),
    Column("response", JSONB),
    CheckConstraint("outcome IN ('done', 'retry', 'stuck', 'lost', 'reset')", name="ck_outboxkit_attempts_outcome"),
    Index("ix_outboxkit_attempts_row", "outbox", "row_id", "attempt"),
    Index("ix_outboxkit_attempts_finished", "outbox", "finished_at"),
)

outbox_minutes = Table(
    "outboxkit_outbox_minutes",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("minute", DateTime(timezone=True), primary_key=True),
    Column("delivered", Integer, nullable=False, server_default=text("0")),
    Column("failed", Integer, nullable=False, server_default=text("0")),
    Column("stuck", Integer, nullable=False, server_default=text("0")),
    Column("pending", BigInteger),
    Column("due", BigInteger),
    Column("oldest_due_seconds", Float),
)

outbox_pauses = Table(
    "outboxkit_outbox_pauses",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("paused_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("paused_by", String(300), nullable=False),
)

# Pending wake-ups (``outboxkit.storage.wakeups``): a row per channel while an insert's NOTIFY is pending, so
# further inserts do not notify; the drain loop deletes them before it claims.  No primary key on the channel:
# two inserts that find none at once each add one, and neither waits for the other.
outbox_wakeups = Table(
    "outboxkit_wakeups",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("channel", String(63), nullable=False, index=True),
)

# The rows a person skipped at the head of their ordering key (``outboxkit.storage.ordering``): each stays
# ``stuck`` in its outbox and no longer holds the rows of its key behind it.
ordering_skips = Table(
    "outboxkit_ordering_skips",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("row_id", BigInteger, primary_key=True),
    Column("skipped_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("skipped_by", String(300), nullable=False),
)

DESTINATION_STATUSES = ("healthy", "open", "half_open", "disabled")

destinations = Table(
    "outboxkit_destinations",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("destination", String(300), primary_key=True),
    Column("status", String(16), nullable=False, server_default=text("'healthy'")),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("window_started_at", DateTime(timezone=True)),
    Column("window_successes", Integer, nullable=False, server_default=text("0")),
    Column("window_failures", Integer, nullable=False, server_default=text("0")),
    Column("opened_at", DateTime(timezone=True)),
    Column("cool_down", Float),
    Column("next_probe_at", DateTime(timezone=True)),
    Column("probe_row_id", BigInteger),
    Column("probe_until", DateTime(timezone=True)),
    Column("slowed_until", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("last_status_code", SmallInteger),
    Column("last_failure_at", DateTime(timezone=True)),
    Column("last_success_at", DateTime(timezone=True)),
    Column("changed_by", String(300)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{status}'" for status in DESTINATION_STATUSES) + ")", name="ck_outboxkit_destinations_status"
    ),
    # Added by migration outboxkit_0010: the states that block their rows (or did), which the ordered claim reads.
    Index(
        "ix_outboxkit_destinations_blocked", "outbox",
        postgresql_where=text("status <> 'healthy' OR slowed_until IS NOT NULL"),
    ),
)

# Added by migration outboxkit_0009_destination_rates (its deferral column dropped by outboxkit_0021).
destination_rates = Table(
    "outboxkit_destination_rates",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("destination", String(300), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Added by migration outboxkit_0020_destination_limits.
destination_limits = Table(
    "outboxkit_destination_limits",
    kit_metadata,
    Column("outbox", String(100), primary_key=True),
    Column("destination", String(300), primary_key=True),
    Column("per_second", Float),
    Column("cap", Integer),
    Column("updated_by", String(200), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("per_second IS NULL OR per_second > 0", name="ck_outboxkit_destination_limits_per_second"),
    CheckConstraint("cap IS NULL OR cap > 0", name="ck_outboxkit_destination_limits_cap"),
    CheckConstraint("per_second IS NOT NULL OR cap IS NOT NULL", name="ck_outboxkit_destination_limits_some"),
)

TRIGGER_KINDS = ("cron", "every", "calendar_interval", "once")

schedules = Table(
    "outboxkit_schedules",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("trigger_kind", String(24), nullable=False),
    Column("trigger_fields", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("timezone", String(64), nullable=False, server_default=text("'UTC'")),
    Column("target_kind", String(8), nullable=False),
    Column("job", String(200)),
    Column("http_outbox", String(100)),
    Column("http_method", String(8)),
    Column("http_url", Text),
    Column("http_headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("http_body", JSONB),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("next_run_at", DateTime(timezone=True)),
    # Added by migration outboxkit_0010: "run now" asked; the next claim fires once, enabled or not.
    Column("run_now_pending", Boolean, nullable=False, server_default=text("false")),
    Column("misfire_grace_seconds", Integer, nullable=False, server_default=text("300")),
    Column("max_running", Integer, nullable=False, server_default=text("1")),
    Column("rerun_if_abandoned", Boolean, nullable=False, server_default=text("false")),
    Column("defined_in", String(8), nullable=False, server_default=text("'api'")),
    # Added by migration outboxkit_0010: where the code declares a schedule defined in code ("module:line").
    Column("declared_at", String(300)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("created_by", String(300), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("changed_by", String(300), nullable=False),
    UniqueConstraint("name", name="uq_outboxkit_schedules_name"),
    CheckConstraint(
        "trigger_kind IN ('cron', 'every', 'calendar_interval', 'once')", name="ck_outboxkit_schedules_trigger_kind"
    ),
    CheckConstraint(
        "(target_kind = 'job' AND job IS NOT NULL AND http_url IS NULL) OR "
        "(target_kind = 'http' AND job IS NULL AND http_url IS NOT NULL AND http_method IS NOT NULL "
        "AND http_outbox IS NOT NULL)",
        name="ck_outboxkit_schedules_target",
    ),
    CheckConstraint("misfire_grace_seconds >= 0", name="ck_outboxkit_schedules_grace"),
    CheckConstraint("max_running >= 1", name="ck_outboxkit_schedules_max_running"),
    CheckConstraint("defined_in IN ('code', 'api')", name="ck_outboxkit_schedules_defined_in"),
    Index(
        "ix_outboxkit_schedules_due",
        "next_run_at",
        postgresql_where=text("(enabled OR run_now_pending) AND next_run_at IS NOT NULL"),
    ),
)

schedule_leases = Table(
    "outboxkit_schedule_leases",
    kit_metadata,
    Column("token", Uuid, primary_key=True),
    Column("schedule_id", BigInteger, ForeignKey("outboxkit_schedules.id", ondelete="CASCADE"), nullable=False),
    Column("run_id", BigInteger, nullable=False),
    Column("scheduled_for", DateTime(timezone=True), nullable=False),
    Column("holder", String(300), nullable=False),
    Column("attempt", SmallInteger, nullable=False, server_default=text("1")),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("attempt IN (1, 2)", name="ck_outboxkit_schedule_leases_attempt"),
    Index("ix_outboxkit_schedule_leases_schedule", "schedule_id"),
    Index("ix_outboxkit_schedule_leases_expires", "expires_at"),
)

SCHEDULE_ACTIONS = ("create", "edit", "enable", "disable", "run_now", "delete", "sync")

schedule_audit = Table(
    "outboxkit_schedule_audit",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(300), nullable=False),
    Column("schedule", String(200), nullable=False),
    Column("action", String(16), nullable=False),
    Column("before", JSONB),
    Column("after", JSONB),
    CheckConstraint(
        "action IN ('create', 'edit', 'enable', 'disable', 'run_now', 'delete', 'sync')",
        name="ck_outboxkit_schedule_audit_action",
    ),
    Index("ix_outboxkit_schedule_audit_schedule_at", "schedule", "at"),
)

# Secrets the kit's processes must share and nobody configured: the admin's signing key, generated by the
# first process that needs it (INSERT ... ON CONFLICT DO NOTHING) and read by every other one.
kit_secrets = Table(
    "outboxkit_secrets",
    kit_metadata,
    Column("name", String(100), primary_key=True),
    Column("value", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Added by migration outboxkit_0012_inbox.
inbox = Table(
    "outboxkit_inbox",
    kit_metadata,
    Column("source", String(200), primary_key=True),
    Column("message_id", String(300), primary_key=True),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_outboxkit_inbox_received_at", "received_at"),
)

inbox_sources = Table(
    "outboxkit_inbox_sources",
    kit_metadata,
    Column("source", String(200), primary_key=True),
    Column("duplicates", BigInteger, nullable=False, server_default=text("0")),
    Column("last_duplicate_at", DateTime(timezone=True)),
    Column("handler_failures", BigInteger, nullable=False, server_default=text("0")),
    Column("last_failure_at", DateTime(timezone=True)),
    Column("last_error", Text),
)

# Events and subscriptions (outboxkit.events), added by migration outboxkit_0013.
subscriptions = Table(
    "outboxkit_subscriptions",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("url", Text, nullable=False),
    # The url's destination (scheme, host, port), written at save; publish copies it onto each delivery.
    Column("destination", String(300)),
    Column("event_types", ARRAY(String(200)), nullable=False),
    Column("tenant", String(200)),
    Column("secrets", ARRAY(Text), nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("description", Text, nullable=False, server_default=text("''")),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("created_by", String(300), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("changed_by", String(300), nullable=False),
    CheckConstraint("cardinality(event_types) >= 1", name="ck_outboxkit_subscriptions_event_types"),
    CheckConstraint("cardinality(secrets) >= 1", name="ck_outboxkit_subscriptions_secrets"),
    CheckConstraint("enabled OR disabled_reason IS NOT NULL", name="ck_outboxkit_subscriptions_disabled_reason"),
    Index("ix_outboxkit_subscriptions_event_types", "event_types", postgresql_using="gin"),
    Index("ix_outboxkit_subscriptions_tenant", "tenant"),
)

SUBSCRIPTION_ACTIONS = ("create", "edit", "enable", "disable", "delete", "rotate", "replay", "test")

subscription_audit = Table(
    "outboxkit_subscription_audit",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(300), nullable=False),
    Column("subscription_id", BigInteger, nullable=False),
    Column("action", String(16), nullable=False),
    Column("before", JSONB),
    Column("after", JSONB),
    CheckConstraint(
        "action IN ('create', 'edit', 'enable', 'disable', 'delete', 'rotate', 'replay', 'test')",
        name="ck_outboxkit_subscription_audit_action",
    ),
    Index("ix_outboxkit_subscription_audit_subscription_at", "subscription_id", "at"),
)

events = Table(
    "outboxkit_events",
    kit_metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("event_type", String(200), nullable=False),
    Column("tenant", String(200)),
    Column("key", String(200)),
    Column("payload", JSONB, nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_outboxkit_events_type_id", "event_type", "id"),
)

event_types = Table(
    "outboxkit_event_types",
    kit_metadata,
    Column("name", String(200), primary_key=True),
    Column("schema", JSONB),
    Column("description", Text, nullable=False, server_default=text("''")),
    Column("changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("changed_by", String(300), nullable=False),
)
