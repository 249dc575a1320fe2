"""``outboxkit destinations``: every destination of every outbox, and resume, disable or probe one now.

::

    outboxkit destinations                                             # list, those needing a person first
    outboxkit destinations --outbox webhooks --json
    outboxkit destinations resume https://billing.internal:443 --outbox webhooks
    outboxkit destinations disable partner-17 --outbox webhooks
    outboxkit destinations probe https://billing.internal:443 --outbox webhooks

They act through the same service as the admin
(``outboxkit.operations.destinations``): each action is audited as
``cli:<user>@<host>``; an unknown outbox or destination fails with one line
and exit code 1, and changes nothing; an action with nothing to do (resume a
healthy destination...) says why and exits 0.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
from typing import TYPE_CHECKING, Annotated, Any

import typer

from outboxkit.cli.application import actor, admin_service, operating
from outboxkit.cli.output import age

if TYPE_CHECKING:
    from outboxkit.operations.destinations import DestinationModel

__all__ = ["destinations"]

destinations = typer.Typer(
    name="destinations",
    help="Destinations: state, failures, rows waiting; resume, disable or probe one now.",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output (also accepted before the command).")]
DestinationName = Annotated[str, typer.Argument(help="The destination's name, as listed.", show_default=False)]
OutboxOption = Annotated[str, typer.Option("--outbox", metavar="NAME", help="The outbox's job name.", show_default=False)]
COLUMNS = [
    "outbox", "destination", "state", "failure_rate", "failures", "last_error", "waiting", "open_since", "next_probe",
    "slowed_until",
]


@destinations.callback()
def list_destinations(
    context: typer.Context,
    outbox: Annotated[str | None, typer.Option(
        "--outbox", metavar="NAME", help="Only this outbox (its job name).", show_default=False)] = None,
    json_output: JsonFlag = False,
) -> None:
    """List every destination of every outbox (or of --outbox): state, failure rate, last error, rows waiting."""
    if context.invoked_subcommand is not None:
        return
    with operating(context, json_output, [outbox] if outbox else []) as (kit, output):
        operations = admin_service(kit).destinations
        outboxes = [operations.of_outbox(outbox)] if outbox else operations.all().outboxes
        rows: list[dict[str, Any]] = []
        for entry in outboxes:
            for destination in entry.destinations:
                rate = destination.failure_rate
                rows.append({
                    "outbox": entry.outbox,
                    "destination": destination.name,
                    "state": destination.status,
                    "failure_rate": f"{rate:.0%}" if rate is not None else "-",
                    "failures": destination.consecutive_failures,
                    "last_error": _last_error(destination),
                    "waiting": f"{destination.waiting_rows}{'+' if destination.waiting_rows_at_least else ''}",
                    "open_since": age(destination.open_since),
                    "next_probe": age(destination.next_probe_at),
                    "slowed_until": age(destination.slowed_until),
                })
        output.emit([entry.model_dump(mode="json") for entry in outboxes], rows, COLUMNS)
        if not rows:
            output.say("no destination has failed")


def _last_error(destination: "DestinationModel") -> str:
    """The last error, marked stale when the destination has answered well since it."""
    text = " ".join(str(part) for part in (destination.last_status_code, destination.last_error) if part is not None)
    text = text.replace("\n", " ")[:100]
    if not text:
        return "-"
    failed, succeeded = destination.last_failure_at, destination.last_success_at
    if failed is not None and succeeded is not None and succeeded > failed:
        return f"(stale: succeeded {age(succeeded)}) {text}"
    return text


def _act(context: typer.Context, action: str, name: str, outbox: str, json_output: bool) -> None:
    with operating(context, json_output, [outbox]) as (kit, output):
        perform = getattr(admin_service(kit).destinations, action)
        result = perform(outbox, name, actor=actor())  # UnknownDestinationError: one line, exit 1
        row = {"outbox": outbox, "destination": name, "result": "changed" if result.changed else f"unchanged: {result.reason}",
               "state": result.status, "released_rows": result.released_rows, "audit_id": result.audit_id or "-"}
        output.emit(result.model_dump(mode="json"), [row], list(row))


@destinations.command()
def resume(context: typer.Context, name: DestinationName, outbox: OutboxOption, json_output: JsonFlag = False) -> None:
    """Healthy again: its failure run and slow-down forgotten, the rows it held back due now (audited)."""
    _act(context, "resume", name, outbox, json_output)


@destinations.command()
def disable(context: typer.Context, name: DestinationName, outbox: OutboxOption, json_output: JsonFlag = False) -> None:
    """Send nothing to it, not even a probe, until it is resumed; its rows wait with their attempts (audited)."""
    _act(context, "disable", name, outbox, json_output)


@destinations.command()
def probe(context: typer.Context, name: DestinationName, outbox: OutboxOption, json_output: JsonFlag = False) -> None:
    """End an open breaker's cool-down now: the next row claimed goes as the probe (audited)."""
    _act(context, "probe", name, outbox, json_output)
