"""The fault suite's outbox and the row history the checks read.

``FaultEvent`` is an outbox with short, real-time settings so a scenario
finishes in seconds: backoff of 50/100/200 ms, a 0.5 s send timeout and a
lease of 2 s (one round of sends plus a 1.5 s ``lease_margin``), so a killed
worker's rows come back quickly.  Each row says how the receiver should
treat it (``behaviour``); its delivery carries the attempt number, so the
receiver's log can be matched with the row's history.

``fault_row_history`` is filled by a trigger on every update of the outbox:
which transaction (its id, start time and ``application_name``) wrote which
attempts, status, due time and claim token.  The checks read it to prove
that attempts never decrease between commits, that no claim starts before a
row is due, and that no claim starts after a worker was told to stop.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Engine, Identity, Integer, String, Table, Text, Uuid, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxOptions

__all__ = ["FAULT_OPTIONS", "FaultBase", "FaultEvent", "install_fault_schema", "row_history"]

# batch_size == concurrency: one round of sends per batch, so the lease is
# timeout + lease_margin = 2 s.  The scenarios pin the per-row outcome rules and
# crash safety, row by row, so the destination breaker is off: it would hold a
# failing receiver's rows back for a cool-down, on purpose (its own scenarios are
# tests/integration/test_destination_drain.py and test_destination_store.py).
FAULT_OPTIONS = OutboxOptions(
    job_name="fault-events",
    backoff=(0.05, 0.1, 0.2),
    max_attempts=6,
    batch_size=16,
    concurrency=16,
    timeout=0.5,
    lease_margin=1.5,
    breaker=None,
)


class FaultBase(DeclarativeBase):
    pass


class FaultEvent(Outbox, FaultBase):
    __tablename__ = "fault_event_outbox"
    __outbox__ = FAULT_OPTIONS

    target_url: Mapped[str] = mapped_column(Text)
    behaviour: Mapped[str] = mapped_column(String(32), default="ok", server_default="ok")

    def build_delivery(self) -> Delivery:
        return Delivery(
            url=self.target_url,
            json={"row": self.id, "behaviour": self.behaviour, "attempt": self.attempts},
            headers={"X-Attempt": str(self.attempts)},
        )


row_history = Table(
    "fault_row_history",
    FaultBase.metadata,
    Column("seq", BigInteger, Identity(always=True), primary_key=True),
    Column("row_id", BigInteger, nullable=False),
    Column("transaction_id", BigInteger, nullable=False),
    Column("transaction_started_at", DateTime(timezone=True), nullable=False),
    Column("written_at", DateTime(timezone=True), nullable=False),
    Column("application_name", Text, nullable=False),
    Column("kind", String(16), nullable=False),  # claim, outcome or other
    Column("attempts", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True)),
    Column("claim_token", Uuid),
)

_HISTORY_TRIGGER = """
CREATE FUNCTION fault_row_history_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fault_row_history (
        row_id, transaction_id, transaction_started_at, written_at, application_name,
        kind, attempts, status, next_attempt_at, claim_token)
    VALUES (
        NEW.id, txid_current(), now(), clock_timestamp(), current_setting('application_name'),
        CASE
            WHEN NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token THEN 'claim'
            WHEN OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL AND NEW.attempts < OLD.attempts THEN 'given_back'
            WHEN OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL THEN 'outcome'
            ELSE 'other'
        END,
        NEW.attempts, NEW.status, NEW.next_attempt_at, NEW.claim_token);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_row_history AFTER UPDATE ON fault_event_outbox
    FOR EACH ROW EXECUTE FUNCTION fault_row_history_write();
"""


def install_fault_schema(engine: Engine) -> None:
    """Create the fault outbox, its history table and the trigger in a (fresh) test database."""
    FaultBase.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(text(_HISTORY_TRIGGER))
