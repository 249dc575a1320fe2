"""The structured fields of the kit's log lines: every line names its event.

Each non-debug line the kit logs passes ``extra=log_fields(...)``: a stable,
dotted ``event_name`` (``drain.row_stuck``, ``notify.reconnected``; the list
is in docs/operations.md, "Structured logs") and the event's fields, as
record attributes a JSON formatter prints as keys.  The human-readable
message stays as it is.  This module sits at the bottom of the layers, so
every module that logs can use it (``outboxkit.telemetry`` re-exports it).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["LoggedRow", "log_fields"]


class LoggedRow(Protocol):
    """What a row event logs of its row (an ``Outbox`` row; typed by shape, so this module sits below the model)."""

    @property
    def id(self) -> int: ...

    @property
    def attempts(self) -> int: ...


def log_fields(event: str, outbox: str | None = None, row: LoggedRow | None = None, **fields: object) -> dict[str, object]:
    """The ``extra=`` of a kit log line: its event name and fields, for a JSON formatter.

    The human-readable message stays as it is; a formatter that prints
    record attributes finds ``event_name`` (e.g. ``drain.row_stuck``, listed in
    docs/operations.md), ``outbox``, ``row`` and ``attempt`` (for a row), and
    the event's own fields.  The key is ``event_name``, not ``event``, which
    structlog's stdlib bridge uses for the message.
    """
    values: dict[str, object] = {"event_name": event}
    if outbox is not None:
        values["outbox"] = outbox
    if row is not None:
        values["row"] = row.id
        values["attempt"] = row.attempts
    values.update(fields)
    return values
