"""``outboxkit inbox``: the inbox per source (received, duplicates dropped, last received, handler failures).

::

    outboxkit inbox
    outboxkit inbox --json

It reads through the same service as the admin (``outboxkit.operations.inbox``)
and changes nothing.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
from typing import Annotated

import typer

from outboxkit.cli.application import operating
from outboxkit.cli.output import age

__all__ = ["inbox"]

COLUMNS = ["source", "received", "last_received", "duplicates", "handler_failures", "last_failure", "last_error"]


def inbox(
    context: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output (also before the command).")] = False,
) -> None:
    """The inbox per source: received, duplicates dropped, last received, handler failures."""
    from outboxkit.operations.inbox import InboxOperations

    with operating(context, json_output) as (kit, output):
        view = InboxOperations(kit).view()
        rows = [
            {
                "source": source.source,
                "received": source.received,
                "last_received": age(source.last_received_at),
                "duplicates": source.duplicates,
                "handler_failures": source.handler_failures,
                "last_failure": age(source.last_failure_at),
                "last_error": (source.last_error or "-").replace("\n", " ")[:100],
            }
            for source in view.sources
        ]
        output.emit(view.model_dump(mode="json"), rows, COLUMNS)
        if not rows:
            output.say("no message has been received yet")
