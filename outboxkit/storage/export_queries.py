"""The export's statement: one keyset batch of an outbox's rows, every column, for ``outboxkit.operations.export``.

An export reads the rows that match an operator's filter
(``outboxkit.storage.row_filter``) in id order, ``limit`` rows after the last id
of the previous batch, each batch its own short read: no transaction and
no server-side cursor stays open while a slow client downloads, and memory
holds one batch at a time whatever the table's size.  The columns are the
kit's own (in the table's order) and then the application's, each of
those cast to text in SQL, as the row detail shows them.  Filters are bind
parameters; the fragments are fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text, types

from outboxkit.errors import InvalidValueError
from outboxkit.model import STATUSES, Outbox
from outboxkit.storage.operator_queries import KIT_COLUMNS, AdminQueries, admin_queries_for
from outboxkit.storage.per_outbox import PerOutbox
from outboxkit.storage.row_filter import RowFilter

__all__ = ["ExportQueries", "export_queries_for"]


class ExportQueries:
    """The export's batch read for one outbox class."""

    def __init__(self, outbox: type[Outbox]) -> None:
        self.admin: AdminQueries = admin_queries_for(outbox)
        table = outbox.__table__  # type: ignore[attr-defined]
        # id first (the export's keyset walks it), then the kit's other columns in the table's order.
        kit_columns = ["id"] + [column.name for column in table.columns if column.name in KIT_COLUMNS - {"id"}]
        self.kit_column_names: list[str] = kit_columns
        self.payload_column_names: list[str] = self.admin.payload_column_names
        # The application's number columns: their text is a number, never a formula (see operations.export).
        self.number_column_names: frozenset[str] = frozenset(
            column.name for column in table.columns if column.name in self.payload_column_names
            and isinstance(column.type, (types.Integer, types.Numeric))
        )
        selected = [f"outbox.{name}" for name in kit_columns]
        selected += [
            f"CAST({self.admin.shown(name, 'outbox.' + quoted)} AS text)" for name, quoted, _ in self.admin.payload_columns
        ]
        self._select = ", ".join(selected)

    @property
    def column_names(self) -> list[str]:
        """The exported columns in order: the kit's, then the application's."""
        return self.kit_column_names + self.payload_column_names

    def check(self, *, status: str | None, row_filter: RowFilter) -> None:
        """Refuse a status or filter this outbox cannot apply before anything is read."""
        if status is not None and status not in STATUSES:
            raise InvalidValueError(f"status must be one of {STATUSES} (or none for every status), got {status!r}")
        self.admin.filter_clauses(row_filter)

    def batch(
        self, connection: Connection, *, status: str | None, row_filter: RowFilter, after_id: int, limit: int
    ) -> Sequence[Sequence[Any]]:
        """Up to ``limit`` matching rows with ids above ``after_id``, in id order, as tuples in ``column_names`` order."""
        filter_sql, params = self.admin.filter_clauses(row_filter)
        if status is not None:
            filter_sql += " AND status = :status"
            params["status"] = status
        statement = text(
            f"SELECT {self._select} FROM {self.admin.table_name} AS outbox "
            f"WHERE id > :after_id{filter_sql} ORDER BY id LIMIT :limit"
        )
        return [tuple(row) for row in connection.execute(statement, {**params, "after_id": after_id, "limit": limit})]


_COMPILED: PerOutbox[type[Outbox], ExportQueries] = PerOutbox(ExportQueries)


def export_queries_for(outbox: type[Outbox]) -> ExportQueries:
    """The export statement for ``outbox``, built once per class."""
    return _COMPILED(outbox)
