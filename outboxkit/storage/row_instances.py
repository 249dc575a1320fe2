"""Model instances from a claim's result rows, built without a Session.

The drain's claim returns each claimed row's table columns, in the table's
order, and hands the rows to the application's ``build_delivery`` as
instances of its model.  Loading them through an ORM ``Session`` (its
identity map, its loading context, the ``Result`` around the cursor) was
about half of the claim's CPU on the idle wake-up path
(docs/performance.md, "Idle latency").  ``RowInstances`` builds the same
instances directly, as the ORM's loader does for a new row: an instance of
the mapped class without ``__init__`` (``ClassManager.new_instance``), each
column's value through the column type's result processor for the dialect
(what ``Result`` applies: a ``TypeDecorator``'s ``process_result_value``, an
``Enum``), stored under its attribute's key, and the identity key set.  No
Session holds it, so it is *detached*, as the ORM's instances were once the
claim's Session closed: every mapped column attribute is loaded and
unmodified, a lazy relationship raises ``DetachedInstanceError`` as before.

A mapping this does not reproduce exactly is loaded through the ORM instead
(``plain`` is False): ``load`` event listeners (``@reconstructor``,
composites, an application's own), polymorphic or inheriting mappings,
deferred columns, a table column not mapped to exactly one attribute, or a
composite primary key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import ColumnProperty, Mapper, configure_mappers
from sqlalchemy.orm.base import instance_state

from outboxkit.model import Outbox

__all__ = ["RowInstances"]

_Processors = list[Callable[[Any], Any] | None]


class RowInstances:
    """Builds detached instances of one outbox class from rows whose leading columns are its table's, in order."""

    def __init__(self, outbox: type[Outbox]) -> None:
        self.outbox = outbox
        self.columns = list(outbox.__table__.c)  # type: ignore[attr-defined]
        self._plain: bool | None = None  # known once the mappers are configured (the first claim)
        self._keys: list[str] = []
        self._primary = 0
        self._identity_class: type[Any] = outbox
        self._new_instance: Callable[[], Any] = outbox
        # Per dialect and the driver's type codes of the table's columns: SQLAlchemy chooses some result
        # processors by the type the database returned (a numeric column, for one).
        self._processors: dict[tuple[Dialect, tuple[Any, ...]], _Processors] = {}

    @property
    def plain(self) -> bool:
        """Whether ``load`` builds this outbox's instances (else the ORM must load them: see the module)."""
        if self._plain is None:
            configure_mappers()  # what the ORM does before its first load: listeners, instrumented attributes
            mapper: Mapper[Any] = inspect(self.outbox)
            plain = _loads_plainly(mapper, self.columns)
            if plain:
                self._keys = [mapper.get_property_by_column(column).key for column in self.columns]
                self._primary = self.columns.index(mapper.primary_key[0])
                self._identity_class = mapper._identity_class
                self._new_instance = mapper.class_manager.new_instance
            self._plain = plain
        return self._plain

    def load(self, dialect: Dialect, type_codes: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[Outbox]:
        """One instance per row, from its first ``len(columns)`` values; ``type_codes`` are the cursor's, per column."""
        assert self.plain, "this outbox's mapping is loaded through the ORM (RowInstances.plain is False)"
        if not rows:
            return []
        width = len(self.columns)
        codes = tuple(type_codes[:width])
        processors = self._processors.get((dialect, codes))
        if processors is None:
            processors = [
                column.type._cached_result_processor(dialect, code)
                for column, code in zip(self.columns, codes, strict=True)
            ]
            self._processors[(dialect, codes)] = processors
        converting = [(index, processor) for index, processor in enumerate(processors) if processor is not None]
        instances = []
        for row in rows:
            values = list(row[:width])
            for index, processor in converting:
                values[index] = processor(values[index])
            instance = self._new_instance()
            instance_state(instance).key = (self._identity_class, (values[self._primary],), None)
            instance.__dict__.update(zip(self._keys, values, strict=True))
            instances.append(instance)
        return instances


def _loads_plainly(mapper: Mapper[Any], columns: list[Any]) -> bool:
    """Whether building instances directly gives what the ORM's loading gives (see the module docstring)."""
    if mapper.class_manager.dispatch.load or mapper.inherits is not None or mapper.polymorphic_on is not None:
        return False
    if len(mapper.primary_key) != 1:
        return False
    for column in columns:
        prop = mapper._columntoproperty.get(column)
        if not isinstance(prop, ColumnProperty) or prop.columns != [column] or prop.deferred:
            return False
    return True
