"""Export: stream an outbox's rows that match a filter as NDJSON or CSV, in constant memory.

``RowExport.open`` checks its input at once (unknown outbox, status, format
or payload column: a refusal before anything is read or sent) and returns
an iterator of byte chunks.  Each chunk is one keyset batch of
``EXPORT_BATCH_ROWS`` rows read in its own short statement
(``outboxkit.storage.export_queries``), so memory holds one batch whatever the
number of rows, and no transaction stays open while a slow client reads.
Rows come in id order; a row that changes while a long export runs shows
as it was when its batch was read.

Columns: the kit's own (``id``, ``idempotency_key``, ``status``, ...,
in the table's order) and then the application's, as text.

* **NDJSON** (``application/x-ndjson``): one JSON object per line; times are
  ISO 8601 strings, the idempotency key and claim token strings, numbers
  numbers, missing values ``null``, the application's columns strings.
* **CSV** (``text/csv``, RFC 4180: comma, double quotes, CRLF): a header
  line, then one line per row; missing values are empty cells.  A text cell
  that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return,
  which a spreadsheet would run as a formula, is written with a leading
  ``'`` (formula injection, as OWASP describes it): ``=HYPERLINK(...)``
  exports as ``'=HYPERLINK(...)``.  Numbers are written as they are: the
  kit's (ids, attempts, status codes) and those of the application's
  integer and numeric columns (``-5`` stays ``-5``); the guard is for text.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Literal

from outboxkit.errors import InvalidValueError
from outboxkit.kit import OutboxKit
from outboxkit.storage.export_queries import ExportQueries, export_queries_for
from outboxkit.storage.row_filter import RowFilter

__all__ = ["EXPORT_BATCH_ROWS", "EXPORT_FORMATS", "ExportFormat", "RowExport", "spreadsheet_safe"]

ExportFormat = Literal["ndjson", "csv"]
EXPORT_FORMATS: dict[str, str] = {"ndjson": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}
EXPORT_BATCH_ROWS = 1_000
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """``text`` with a leading ``'`` if a spreadsheet would read it as a formula."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class RowExport:
    """Streams the rows of the kit's outboxes (see the module)."""

    def __init__(self, kit: OutboxKit, *, batch_rows: int = EXPORT_BATCH_ROWS) -> None:
        self.kit = kit
        self.batch_rows = batch_rows

    def open(self, outbox_name: str, *, row_filter: RowFilter, status: str | None, format: str) -> Iterator[bytes]:
        """The export's chunks; every refusal is raised here, before the first chunk."""
        if format not in EXPORT_FORMATS:
            raise InvalidValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {format!r}")
        queries = export_queries_for(self.kit.outbox(outbox_name))  # UnknownOutboxError for a bad name
        queries.check(status=status, row_filter=row_filter)
        return self._chunks(queries, row_filter=row_filter, status=status, format=format)

    def _chunks(self, queries: ExportQueries, *, row_filter: RowFilter, status: str | None, format: str) -> Iterator[bytes]:
        names = queries.column_names
        numbers = frozenset(index for index, name in enumerate(names) if name in queries.number_column_names)

        def encode(names: list[str], rows: Sequence[Sequence[Any]]) -> bytes:
            return _csv_lines(rows, numbers=numbers) if format == "csv" else _ndjson_lines(names, rows)

        header = _csv_lines([names]) if format == "csv" else b""
        after_id = 0
        while True:
            with self.kit.operator_database.connect() as connection:
                rows = queries.batch(connection, status=status, row_filter=row_filter, after_id=after_id, limit=self.batch_rows)
            chunk = header + encode(names, rows)
            header = b""
            if chunk:
                yield chunk
            if len(rows) < self.batch_rows:
                return
            after_id = rows[-1][0]  # id is the first kit column


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _ndjson_lines(names: list[str], rows: Sequence[Sequence[Any]]) -> bytes:
    lines = [json.dumps(dict(zip(names, map(_plain, row), strict=True)), separators=(",", ":")) for row in rows]
    return "".join(line + "\n" for line in lines).encode()


def _csv_lines(rows: Sequence[Sequence[Any]], *, numbers: frozenset[int] = frozenset()) -> bytes:
    """CSV lines of ``rows``; the cells at ``numbers`` hold a number column's text, written as it is."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    for row in rows:
        writer.writerow(_csv_cell(value, number=index in numbers) for index, value in enumerate(row))
    return buffer.getvalue().encode()


def _csv_cell(value: Any, *, number: bool) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and not number:
        return spreadsheet_safe(value)
    return _plain(value)
