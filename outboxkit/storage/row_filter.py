"""Which rows an operator means: the filter the admin, the CLI and bulk resets narrow rows with.

A ``RowFilter`` is a value the pages, the JSON API and the CLI build from
their input; ``RowFilter.clauses`` turns it into fixed SQL fragments whose
values stay bind parameters, for ``outboxkit.storage.operator_queries`` to append to
its statements.  No string from a request is ever spliced into SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["RowFilter", "escape_like", "utc_moment"]

_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
_LATEST = datetime.max.replace(tzinfo=timezone.utc)


def utc_moment(moment: datetime) -> datetime:
    """A filter's time in UTC (without an offset it is read as UTC, as the admin shows times).

    A time whose UTC equivalent falls outside years 1 to 9999, such as
    ``9999-12-31T23:59:59-01:00``, cannot be held by a Python datetime; it is
    moved to the nearest end of that range, which no stored row lies beyond,
    so the filter keeps selecting the rows the operator meant.
    """
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:
        return _EARLIEST if moment.year == 1 else _LATEST


@dataclass(frozen=True, kw_only=True, slots=True)
class RowFilter:
    """Which rows an operator means; every field narrows (AND), None leaves it out.

    ``error_contains`` is a substring of ``last_error``, ``status_code`` the
    exact last code; ``created_*``, ``updated_*`` and ``delivered_*`` are half-open time ranges
    (``after`` inclusive, ``before`` exclusive); ``attempts_min``/``_max``
    bound the attempts; ``payload_contains`` is a substring of one of the
    application's columns, ``payload_column``, as text (the caller checks
    the column is one of ``AdminQueries.payload_columns``); ``due_at`` is an
    exact ``next_attempt_at``: the rows a destination holds back all carry
    its hold's end (``outboxkit.destinations.views``), so it lists them.
    """

    error_contains: str | None = None
    status_code: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    delivered_after: datetime | None = None
    delivered_before: datetime | None = None
    attempts_min: int | None = None
    attempts_max: int | None = None
    payload_column: str | None = None
    payload_contains: str | None = None
    due_at: datetime | None = None

    def clauses(self, payload_sql: str | None = None) -> tuple[str, dict[str, Any]]:
        """Fixed SQL fragments and their bind parameters (the strings stay data).

        ``payload_sql`` is the quoted column for ``payload_column``, from
        ``AdminQueries`` (never from a request).
        """
        sql, params = "", dict[str, Any]()
        if self.error_contains:
            sql += " AND last_error ILIKE :error_pattern ESCAPE '\\'"
            params["error_pattern"] = "%" + escape_like(self.error_contains) + "%"
        if self.status_code is not None:
            sql += " AND last_status_code = :status_code"
            params["status_code"] = self.status_code
        for name, column_name, operator in _RANGE_CLAUSES:
            value = getattr(self, name)
            if value is not None:
                sql += f" AND {column_name} {operator} :{name}"
                params[name] = value
        if self.payload_contains and payload_sql is not None:
            sql += f" AND CAST({payload_sql} AS text) ILIKE :payload_pattern ESCAPE '\\'"
            params["payload_pattern"] = "%" + escape_like(self.payload_contains) + "%"
        return sql, params

    @property
    def active(self) -> bool:
        return any(getattr(self, name) is not None for name in self.__dataclass_fields__ if name != "payload_column")

    def as_dict(self) -> dict[str, Any]:
        """The base fields always, the others when set; times as ISO 8601 (it goes into URLs and the audit)."""
        values: dict[str, Any] = {"error_contains": self.error_contains, "status_code": self.status_code}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name not in values and value is not None and not (name == "payload_column" and not self.payload_contains):
                values[name] = value.isoformat() if isinstance(value, datetime) else value
        return values


_RANGE_CLAUSES = (
    ("created_after", "created_at", ">="),
    ("created_before", "created_at", "<"),
    ("updated_after", "updated_at", ">="),
    ("updated_before", "updated_at", "<"),
    ("delivered_after", "delivered_at", ">="),
    ("delivered_before", "delivered_at", "<"),
    ("attempts_min", "attempts", ">="),
    ("attempts_max", "attempts", "<="),
    ("due_at", "next_attempt_at", "="),
)


def escape_like(value: str) -> str:
    """Make ``%``, ``_`` and ``\\`` match themselves in a LIKE pattern with ``ESCAPE '\\'``."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
