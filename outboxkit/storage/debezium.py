"""The columns Debezium's outbox event router reads, and rows written for change data capture.

An outbox relayed by change data capture (``OutboxOptions(relay="cdc")``, docs/cdc.md) is read from the
WAL by a connector, not drained by the kit.  ``DebeziumColumns`` gives it the router's columns under the
router's default names, so the connector needs no renaming of fields:

==================  ==========================================================
``aggregatetype``   the topic the event is routed to (``route.by.field``)
``aggregateid``     the message key (``table.field.event.key``): the ordering key
``type``            the event's type (a header, ``table.fields.additional.placement``)
``payload``         the event as JSON (``table.field.event.payload``)
==================  ==========================================================

The row's ``idempotency_key`` (a UUID) is the event's id (``table.field.event.id``), so a consumer
de-duplicates a row that a connector restart sends twice by the same key the kit's own transports use.

``capture(session, row)`` writes a row for the connector in the caller's transaction and deletes it in the
same transaction: the WAL holds the insert, which the connector turns into a message, and the delete, which
the router ignores; the table stays empty and nothing waits to be drained.  A rolled-back transaction leaves
no change in the WAL's decoded stream, so no message.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, Session, mapped_column

from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox

__all__ = ["DebeziumColumns", "capture"]


class DebeziumColumns:
    """Mixin: the outbox event router's columns.  List it before ``Outbox``: ``class E(DebeziumColumns, Outbox, Base)``."""

    aggregatetype: Mapped[str] = mapped_column(String(255))
    aggregateid: Mapped[str] = mapped_column(String(255))
    type: Mapped[str] = mapped_column(String(255))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)


def capture(session: Session, row: Outbox) -> None:
    """Write ``row`` to the WAL for the connector, in ``session``'s transaction, and leave the table without it.

    The row is inserted (flushed, so its ``id`` and ``idempotency_key`` are set) and deleted in the caller's
    transaction: it reaches the connector if and only if the caller commits.  Only an outbox declared
    ``relay="cdc"`` is accepted: the kit would otherwise be expected to deliver it.
    """
    options = type(row).__outbox__
    if options.relay != "cdc":
        raise ConfigurationError(
            f"outbox {options.job_name!r} is drained by the kit (relay={options.relay!r}); capture() is for an outbox "
            "declared OutboxOptions(relay='cdc'), whose rows a change data capture connector reads"
        )
    session.add(row)
    session.flush()
    session.delete(row)
    session.flush()
