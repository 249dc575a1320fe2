"""The admin pages' inputs: query and form fields parsed strictly, each malformed field a clear ``PageInputError`` (422).

A number is ASCII digits (``"²".isdigit()`` is true in Python, and
``int("²")`` raises); a time is ISO 8601, read as UTC when it has no offset
(``datetime-local`` sends none, and the pages show UTC).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import FormData

from outboxkit.errors import PageInputError
from outboxkit.operations.charts import CHART_WINDOWS
from outboxkit.operations.schemas import MAX_BULK_IDS, MAX_ROW_ID, ChartWindow, FilterText, RowFilter, utc_moment

__all__ = [
    "FILTER_FIELDS",
    "PAGE_SIZES",
    "ascii_number",
    "chart_window",
    "form_text",
    "is_advanced",
    "row_filter_from",
    "selected_ids",
]

_FILTER_TEXT = TypeAdapter(FilterText)


def ascii_number(value: str, *, low: int, high: int, what: str) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(high)) or not low <= int(value) <= high:
        raise PageInputError(f"{what} must be a whole number from {low} to {high}, got {value[:40]!r}")
    return int(value)


def chart_window(value: str | None) -> ChartWindow:
    """The overview's chart window: ``1h`` (the default), ``24h`` or ``7d``."""
    if value in (None, ""):
        return "1h"
    if value not in CHART_WINDOWS:
        raise PageInputError(f"window must be one of {', '.join(CHART_WINDOWS)}, got {value[:20]!r}")
    return cast(ChartWindow, value)


FILTER_FIELDS = (
    "error_contains",
    "status_code",
    "created_after",
    "created_before",
    "updated_after",
    "updated_before",
    "delivered_after",
    "delivered_before",
    "attempts_min",
    "attempts_max",
    "payload_column",
    "payload_contains",
    "due_at",
)
PAGE_SIZES = (20, 50, 100, 200)


def _moment(value: str, what: str) -> datetime:
    """An ISO 8601 time from a form (``datetime-local`` sends no offset: it is read as UTC, as the pages show times)."""
    try:
        moment = datetime.fromisoformat(value) if value.isascii() and len(value) <= 40 else None
    except ValueError:
        moment = None
    if moment is None:
        raise PageInputError(f"bad filter: {what} must be a time like 2030-01-01T12:00 (UTC), got {value[:40]!r}")
    return utc_moment(moment)


def _filter_text(value: str | None, what: str) -> str | None:
    try:
        return _FILTER_TEXT.validate_python(value or None)
    except ValidationError as exc:
        raise PageInputError(f"bad filter: {what}: {exc.errors()[0]['msg']}") from None


def row_filter_from(values: Callable[[str], str | None]) -> RowFilter:
    """The filter from query or form fields (``values(name)``); each malformed field is a clear 422."""
    fields: dict[str, Any] = {}
    for name in FILTER_FIELDS:
        raw = values(name)
        value = raw.strip() if isinstance(raw, str) else ""
        if not value:
            continue
        if name == "status_code":
            fields[name] = ascii_number(value, low=100, high=599, what="bad filter: the status code")
        elif name.startswith("attempts_"):
            fields[name] = ascii_number(value, low=0, high=1_000_000, what=f"bad filter: {name.replace('_', ' ')}")
        elif name.endswith(("_after", "_before", "_at")):
            fields[name] = _moment(value, name.replace("_", " "))
        else:
            fields[name] = _filter_text(raw, name.replace("_", " "))
    return RowFilter(**fields)


def is_advanced(row_filter: RowFilter) -> bool:
    """Whether a filter beyond error text and status code is set (the page then shows those fields open)."""
    return any(value is not None for name, value in row_filter.as_dict().items() if name not in ("error_contains", "status_code"))


def selected_ids(values: list[Any]) -> list[int]:
    if not values:
        raise PageInputError("bad selection: select at least one row")
    if len(values) > MAX_BULK_IDS:
        raise PageInputError(f"bad selection: at most {MAX_BULK_IDS} rows at once")
    return [
        ascii_number(value if isinstance(value, str) else "", low=1, high=MAX_ROW_ID, what="bad selection: a row id")
        for value in values
    ]


def form_text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None
