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
by the drain in batches, see ``outboxkit.attempts``), kept for
``attempt_history_days``; it outlives a reset, so the reason a row got stuck
stays readable after it was sent again.  Its index on (``outbox``,
``finished_at``) serves the retention trim and the overview's charts.

``outboxkit_outbox_minutes`` holds one row per outbox and minute for the
overview's charts: attempts that delivered, failed and got stuck (added by
every drainer as it writes its attempt history) and a sample of the backlog
(pending and due rows, the oldest due row's age) taken by the drainers once
a minute.  Kept as long as the attempt history.

``outboxkit_outbox_pauses`` lists the outboxes whose drains are paused (one
row each); every drainer reads it before claiming (``outboxkit.pauses``).

``outboxkit_destinations`` holds the state of each destination of each
outbox (one row per pair, created by its first recorded outcome): the
circuit breaker's status, its failure run, recent outcome counts, when it
opened, the next probe, the last error (``outboxkit.destinations`` for the
rules, ``outboxkit.destination_store`` for the statements).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

__all__ = ["attempts", "destinations", "job_runs", "kit_metadata", "outbox_minutes", "outbox_pauses", "reset_audit"]

kit_metadata = MetaData()

RUN_OUTCOMES = ("running", "ok", "error", "abandoned")  # abandoned: its scheduler died mid-run

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
    CheckConstraint("outcome IN ('running', 'ok', 'error', 'abandoned')", name="ck_outboxkit_job_runs_outcome"),
    Index("ix_outboxkit_job_runs_job_started", "job_id", "started_at"),
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
        "action IN ('reset', 'retry_now', 'pause', 'resume', 'drain_now', 'replay')", name="ck_outboxkit_reset_audit_action"
    ),
    Index("ix_outboxkit_reset_audit_at", "at"),
)

ATTEMPT_OUTCOMES = ("done", "retry", "stuck", "lost")  # lost: the row was reset or re-claimed during the send

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
    CheckConstraint("outcome IN ('done', 'retry', 'stuck', 'lost')", name="ck_outboxkit_attempts_outcome"),
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
    Column("held_until", DateTime(timezone=True)),
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
)
