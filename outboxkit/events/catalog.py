"""The catalog of event types: a name, an optional JSON Schema, a description.

``publish`` reads it in the caller's transaction: a type with a schema has
its payload checked (``outboxkit.events.schema_check``), and a publish with
``strict=True`` refuses a type the catalog does not list.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects.postgresql import insert

from outboxkit.errors import InvalidEventError
from outboxkit.events.definitions import EVENT_TYPE, MAX_NAME
from outboxkit.events.schema_check import check_schema
from outboxkit.storage.tables import event_types

__all__ = ["EventTypeCatalog"]


class EventTypeCatalog:
    """Defines, lists and removes event types."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def define(self, name: str, *, schema: dict[str, Any] | None = None, description: str = "", actor: str) -> None:
        """Add the type ``name``, or replace its schema and description."""
        if not isinstance(name, str) or len(name) > MAX_NAME or not EVENT_TYPE.fullmatch(name):
            raise InvalidEventError("event_type", f"{str(name)[:80]!r} is not an event type name (e.g. invoice.paid)")
        if schema is not None:
            check_schema(schema)
        values = {"name": name, "schema": schema, "description": description, "changed_by": actor}
        statement = insert(event_types).values(values)
        statement = statement.on_conflict_do_update(
            index_elements=["name"],
            set_={"schema": statement.excluded.schema, "description": statement.excluded.description,
                  "changed_by": statement.excluded.changed_by, "changed_at": statement.excluded.changed_at},
        )
        with self.engine.begin() as connection:
            connection.execute(statement)

    def list(self) -> list[dict[str, Any]]:
        with self.engine.connect() as connection:
            return [dict(row) for row in connection.execute(select(event_types).order_by(event_types.c.name)).mappings()]

    def remove(self, name: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(event_types).where(event_types.c.name == name))
