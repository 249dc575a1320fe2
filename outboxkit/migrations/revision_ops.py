"""What every migration helper shares: the outbox classes it was given, checked, and the Alembic operations it
runs statements through (``op`` by default)."""

from __future__ import annotations

from collections.abc import Iterable

from alembic.operations import Operations

from outboxkit.errors import ConfigurationError
from outboxkit.model import Outbox

__all__ = ["checked_outboxes", "execute_all", "migration_operations"]


def checked_outboxes(outboxes: tuple[type[Outbox], ...]) -> tuple[type[Outbox], ...]:
    """``outboxes``, refused with a clear error unless each is a mapped ``Outbox`` subclass."""
    if not outboxes:
        raise ConfigurationError("name at least one outbox class, e.g. install_notify_triggers(OrderOutbox)")
    for outbox in outboxes:
        if not (isinstance(outbox, type) and issubclass(outbox, Outbox) and hasattr(outbox, "__table__")):
            raise ConfigurationError(f"{outbox!r} is not a mapped Outbox subclass")
    return outboxes


def migration_operations(operations: Operations | None) -> Operations:
    """``operations``, or Alembic's ``op`` inside a revision."""
    if operations is None:
        from alembic import op

        return op  # type: ignore[return-value]
    return operations


def execute_all(operations: Operations | None, statements: Iterable[str]) -> None:
    """Run each statement through the migration's operations (printed in offline mode)."""
    operations = migration_operations(operations)
    for statement in statements:
        operations.execute(statement)
