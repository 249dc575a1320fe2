"""outboxkit: events, subscriptions and the deliveries outbox

``outboxkit_subscriptions`` (endpoint, event-type filters, tenant, signing secrets, headers, enabled)
and its audit, ``outboxkit_events`` (every published event), ``outboxkit_event_types`` (the catalog)
and ``outboxkit_event_deliveries``, the kit's outbox of deliveries (the outbox mixin's columns,
constraints and indexes, with an ordering key) and its NOTIFY trigger.

Revision ID: outboxkit_0013
Revises: outboxkit_0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "outboxkit_0013"
down_revision = "outboxkit_0012"
branch_labels = None
depends_on = None

DELIVERIES = "outboxkit_event_deliveries"
NOTIFY_FUNCTION = '"outboxkit_notify_outboxkit_event_deliveries"'
NOTIFY_TRIGGER = '"outboxkit_notify_outboxkit_event_deliveries_insert"'


def upgrade() -> None:
    op.create_table(
        "outboxkit_subscriptions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_types", postgresql.ARRAY(sa.String(200)), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("secrets", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("headers", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("description", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column("disabled_reason", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("created_by", sa.String(300), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("changed_by", sa.String(300), nullable=False),
        sa.CheckConstraint("cardinality(event_types) >= 1", name="ck_outboxkit_subscriptions_event_types"),
        sa.CheckConstraint("cardinality(secrets) >= 1", name="ck_outboxkit_subscriptions_secrets"),
        sa.CheckConstraint("enabled OR disabled_reason IS NOT NULL", name="ck_outboxkit_subscriptions_disabled_reason"),
    )
    op.create_index(
        "ix_outboxkit_subscriptions_event_types", "outboxkit_subscriptions", ["event_types"], postgresql_using="gin"
    )
    op.create_index("ix_outboxkit_subscriptions_tenant", "outboxkit_subscriptions", ["tenant"])
    op.create_table(
        "outboxkit_subscription_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("subscription_id", sa.BigInteger(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("before", postgresql.JSONB()),
        sa.Column("after", postgresql.JSONB()),
        sa.CheckConstraint(
            "action IN ('create', 'edit', 'enable', 'disable', 'delete')", name="ck_outboxkit_subscription_audit_action"
        ),
    )
    op.create_index(
        "ix_outboxkit_subscription_audit_subscription_at", "outboxkit_subscription_audit", ["subscription_id", "at"]
    )
    op.create_table(
        "outboxkit_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("event_type", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("key", sa.String(200)),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_outboxkit_events_type_id", "outboxkit_events", ["event_type", "id"])
    op.create_table(
        "outboxkit_event_types",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("schema", postgresql.JSONB()),
        sa.Column("description", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("changed_by", sa.String(300), nullable=False),
    )
    op.create_table(
        DELIVERIES,
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("subscription_id", sa.BigInteger(), nullable=False),
        sa.Column("event_type", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("ordering_key", sa.String(300)),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("headers", postgresql.JSONB(), nullable=False),
        sa.Column("body", postgresql.JSONB(), nullable=False),
        # The outbox mixin's columns.
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("idempotency_key", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("status", sa.String(16), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_error", sa.Text()),
        sa.Column("last_status_code", sa.SmallInteger()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.Column("claimed_until", sa.DateTime(timezone=True)),
        sa.Column("claim_token", sa.Uuid()),
        sa.CheckConstraint("status IN ('pending', 'done', 'stuck')", name=f"ck_{DELIVERIES}_status"),
        sa.UniqueConstraint("idempotency_key", name=f"uq_{DELIVERIES}_idempotency_key"),
    )
    pending = sa.text("status = 'pending'")
    op.create_index(f"ix_{DELIVERIES}_due_id", DELIVERIES, ["next_attempt_at", "id"], postgresql_where=pending)
    op.create_index(f"ix_{DELIVERIES}_stuck", DELIVERIES, ["id"], postgresql_where=sa.text("status = 'stuck'"))
    op.create_index(
        f"ix_{DELIVERIES}_claimed", DELIVERIES, ["claimed_until"], postgresql_where=sa.text("claimed_until IS NOT NULL")
    )
    op.create_index(
        f"ix_{DELIVERIES}_order", DELIVERIES, ["ordering_key", "id"],
        postgresql_where=sa.text("status <> 'done' AND ordering_key IS NOT NULL"),
    )
    op.create_index(
        f"ix_{DELIVERIES}_due_unkeyed", DELIVERIES, ["next_attempt_at", "id"],
        postgresql_where=sa.text("status = 'pending' AND ordering_key IS NULL"),
    )
    op.create_index(
        f"ix_{DELIVERIES}_subscription", DELIVERIES, ["subscription_id"], postgresql_where=sa.text("status <> 'done'")
    )
    op.execute(
        f"""CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{DELIVERIES}', '');
    RETURN NULL;
END
$$"""
    )
    op.execute(
        f"CREATE TRIGGER {NOTIFY_TRIGGER} AFTER INSERT ON {DELIVERIES} FOR EACH STATEMENT EXECUTE FUNCTION {NOTIFY_FUNCTION}()"
    )


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON {DELIVERIES}")
    op.execute(f"DROP FUNCTION IF EXISTS {NOTIFY_FUNCTION}()")
    op.drop_table(DELIVERIES)
    op.drop_table("outboxkit_event_types")
    op.drop_table("outboxkit_events")
    op.drop_table("outboxkit_subscription_audit")
    op.drop_table("outboxkit_subscriptions")
