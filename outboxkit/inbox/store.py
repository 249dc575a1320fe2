"""The inbox's one call, ``record_message``, and the counts it keeps beside the records.

``record_message`` runs inside the consumer's own transaction (a ``Session``
or a ``Connection`` that has begun one) and inserts ``(source, message_id)``
into ``outboxkit_inbox`` with ``INSERT ... ON CONFLICT DO NOTHING``.  It
returns True when this transaction inserted the record (handle the message,
in the same transaction) and False when the message was already handled
(skip it).  There is no read before the write, so no race between a check and
an insert: when two deliveries of one message arrive together, PostgreSQL
makes the second INSERT wait for the first transaction.  If that one commits,
the second sees a conflict and is told "already handled"; if it rolls back
(its handler raised), the second inserts and handles the message.

Because the record is written in the consumer's transaction, the business
write and the record commit together or not at all: a handler that raises
rolls both back, and the next delivery handles the message again.

A duplicate also adds one to its source's ``duplicates`` in
``outboxkit_inbox_sources``, in the same transaction (a duplicate's
transaction writes nothing else).  A handler failure is counted with
``record_handler_failure``, in a transaction of its own after the
consumer's rolled back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, func
from sqlalchemy.dialects.postgresql import insert

from outboxkit.errors import InvalidTypeError, InvalidValueError
from outboxkit.storage.tables import inbox, inbox_sources

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["ERROR_LIMIT", "MESSAGE_ID_LIMIT", "SOURCE_LIMIT", "check_source", "record_handler_failure", "record_message"]

SOURCE_LIMIT = 200
MESSAGE_ID_LIMIT = 300
# The last handler error kept per source, in characters.
ERROR_LIMIT = 2000


def check_source(source: object) -> str:
    """``source`` if it is a name of 1 to 200 printable characters; otherwise an error saying what a source is."""
    return _check_name(source, "source", SOURCE_LIMIT, " naming the sender (e.g. 'billing')")


def check_message_id(message_id: object) -> str:
    """``message_id`` if it is an id of 1 to 300 printable characters; otherwise an error."""
    return _check_name(message_id, "message id", MESSAGE_ID_LIMIT, "")


def _check_name(value: object, what: str, limit: int, meaning: str) -> str:
    if not isinstance(value, str):
        raise InvalidTypeError(f"an inbox {what} must be a string{meaning}, got {type(value).__name__}")
    if not 1 <= len(value) <= limit or not value.isprintable():
        raise InvalidValueError(f"an inbox {what} must be 1 to {limit} printable characters{meaning}, got {value!r:.60}")
    return value


def record_message(transaction: Session | Connection, *, source: str, message_id: str) -> bool:
    """Record ``message_id`` from ``source`` in this transaction: True if it is new, False if already handled.

    ``transaction`` is the consumer's ``Session`` (or ``Connection``) with the
    business write; commit it as usual.  On True, handle the message in the
    same transaction; on False, do nothing more: its effect has already
    committed.  A bad source or id raises before anything is written.
    """
    check_source(source)
    check_message_id(message_id)
    inserted = transaction.execute(
        insert(inbox).values(source=source, message_id=message_id).on_conflict_do_nothing().returning(inbox.c.source)
    ).first()
    if inserted is not None:
        return True
    transaction.execute(
        insert(inbox_sources)
        .values(source=source, duplicates=1, last_duplicate_at=func.now())
        .on_conflict_do_update(
            index_elements=[inbox_sources.c.source],
            set_={"duplicates": inbox_sources.c.duplicates + 1, "last_duplicate_at": func.now()},
        )
    )
    return False


def record_handler_failure(engine: Engine, *, source: str, error: str) -> None:
    """Count one handler failure of ``source`` and keep its error, in a transaction of its own."""
    check_source(source)
    error = error[:ERROR_LIMIT]
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_sources)
            .values(source=source, handler_failures=1, last_failure_at=func.now(), last_error=error)
            .on_conflict_do_update(
                index_elements=[inbox_sources.c.source],
                set_={
                    "handler_failures": inbox_sources.c.handler_failures + 1,
                    "last_failure_at": func.now(),
                    "last_error": error,
                },
            )
        )
