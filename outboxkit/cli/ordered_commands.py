"""``outboxkit blocked`` and ``outboxkit skip``: the stuck heads of an ordered outbox, and skipping them.

::

    outboxkit blocked orders                 # each stuck head, its key and the rows waiting behind it
    outboxkit skip orders 41                 # row 41 stays stuck; the rows of its key behind it are sent

For an outbox with an ordering key (``OutboxOptions.ordering_key``), a stuck row
blocks its key.  ``reset`` sends it again (its key waits for it); ``skip``
leaves it stuck, never deleted, and lets the rows behind it go.  Both run
through the same service as the admin (``outboxkit.operations.ordered_keys``):
a skip is audited as ``cli:<user>@<host>`` (action ``skip``) and wakes the drains.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
from typing import Annotated

import typer

from outboxkit.cli.application import CommandError, actor, admin_service, operating
from outboxkit.errors import NotOrderedError, RowsNotFound

__all__ = ["blocked", "skip"]

MAX_ROW_ID = 2**63 - 1


def _row_id(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_ROW_ID:
        raise typer.BadParameter(f"{value!r} is not a row id (1 to 2^63-1)")
    return int(value)


def blocked(
    context: typer.Context,
    outbox: Annotated[str, typer.Argument(help="The outbox's job name.", show_default=False)],
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the stuck heads of an ordered outbox: each blocks its key; how many rows wait behind it."""
    with operating(context, json_output, [outbox]) as (kit, output):
        try:
            found = admin_service(kit).ordered_keys.blocked_keys(outbox)
        except NotOrderedError as exc:
            raise CommandError(str(exc)) from None
        rows = [
            {"id": head.id, "key": head.key, "waiting": f"{head.waiting}{'+' if head.waiting > found.waiting_cap else ''}",
             "attempts": head.attempts, "last_error": (head.last_error or "").replace("\n", " ")[:100]}
            for head in found.keys
        ]
        output.emit(found.model_dump(mode="json"), rows, ["id", "key", "waiting", "attempts", "last_error"])
        if found.more:
            output.say(f"the first {len(found.keys)} stuck heads")


def skip(
    context: typer.Context,
    outbox: Annotated[str, typer.Argument(help="The outbox's job name.", show_default=False)],
    ids: Annotated[list[int], typer.Argument(parser=_row_id, show_default=False, help="Stuck row ids.")],
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Skip stuck rows in their key's order: they stay stuck (never deleted); the rows behind them are sent."""
    with operating(context, json_output, [outbox]) as (kit, output):
        try:
            result = admin_service(kit).skip(outbox, ids, actor=actor())
        except (NotOrderedError, RowsNotFound) as exc:
            raise CommandError(str(exc)) from None
        rows = [{"id": changed, "result": "skipped in its key's order"} for changed in result.changed_ids]
        rows += [{"id": left.id, "result": f"left alone: {left.reason}"} for left in result.skipped]
        output.emit(result.model_dump(mode="json"), rows, ["id", "result"])
