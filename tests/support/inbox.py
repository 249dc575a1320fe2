"""A consumer's business table for the inbox tests: one counter per message, incremented by each handling."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

CREATE_APPLIED = "CREATE TABLE IF NOT EXISTS applied (message_id text PRIMARY KEY, times integer NOT NULL)"


def create_applied_table(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(CREATE_APPLIED))


def apply(transaction: Session | Connection, message_id: str) -> None:
    """The business write: add one to the message's counter (a second handling would make it 2)."""
    transaction.execute(
        text(
            "INSERT INTO applied (message_id, times) VALUES (:id, 1) "
            "ON CONFLICT (message_id) DO UPDATE SET times = applied.times + 1"
        ),
        {"id": message_id},
    )


def applied(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {row[0]: row[1] for row in connection.execute(text("SELECT message_id, times FROM applied"))}


def records(engine: Engine) -> set[tuple[str, str]]:
    with engine.connect() as connection:
        return {(row[0], row[1]) for row in connection.execute(text("SELECT source, message_id FROM outboxkit_inbox"))}
