"""``outboxkit destinations``: every destination of every outbox, and resume, disable or probe one now.

::

    outboxkit destinations                                             # list, those needing a person first
    outboxkit destinations --outbox webhooks --json
    outboxkit destinations resume https://billing.internal:443 --outbox webhooks
    outboxkit destinations disable partner-17 --outbox webhooks
    outboxkit destinations probe https://billing.internal:443 --outbox webhooks
    outboxkit destinations limit https://billing.internal:443 --outbox webhooks                 # its limits
    outboxkit destinations limit https://billing.internal:443 --outbox webhooks --rate 5 --cap 4
    outboxkit destinations limit https://billing.internal:443 --outbox webhooks --rate default  # the outbox's own
    outboxkit destinations limit https://billing.internal:443 --outbox webhooks --clear         # both back

They act through the same service as the admin
(``outboxkit.operations.destinations``): each action is audited as
``cli:<user>@<host>``; an unknown outbox or destination fails with one line
and exit code 1, and changes nothing; an action with nothing to do (resume a
healthy destination...) says why and exits 0.  ``limit`` changes only the
limits it is given (``outboxkit.operations.destination_limits``); a value
that is not a positive number (a whole one for ``--cap``) fails with one line,
exit code 1, and changes nothing.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
from typing import TYPE_CHECKING, Annotated, Any

import typer

from outboxkit.cli.application import CommandError, actor, admin_service, operating
from outboxkit.cli.output import age
from outboxkit.operations.destination_limits import limit_from_text

if TYPE_CHECKING:
    from outboxkit.operations.destination_limits import DestinationLimitsModel
    from outboxkit.operations.destinations import DestinationModel

__all__ = ["destinations"]

destinations = typer.Typer(
    name="destinations",
    help="Destinations: state, failures, rows waiting; resume, disable or probe one now; set its limits.",
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


RateOption = Annotated[str | None, typer.Option(
    "--rate", metavar="PER_SECOND", show_default=False, help="Requests per second, across every process, or 'default'.")]
CapOption = Annotated[str | None, typer.Option(
    "--cap", metavar="SENDS", show_default=False, help="Most sends in flight at once, across every process, or 'default'.")]


@destinations.command()
def limit(
    context: typer.Context,
    name: DestinationName,
    outbox: OutboxOption,
    rate: RateOption = None,
    cap: CapOption = None,
    clear: Annotated[bool, typer.Option("--clear", help="Both limits back to the outbox's own.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Show or change a destination's rate limit (--rate, requests per second) and cap on sends in flight (--cap),
    without a restart; 'default' (or --clear) goes back to the outbox's own (audited)."""
    with operating(context, json_output, [outbox]) as (kit, output):
        limits = admin_service(kit).destination_limits
        current = limits.get(outbox, name)  # UnknownDestinationError: one line, exit 1
        if rate is None and cap is None and not clear:
            output.emit(current.model_dump(mode="json"), [_limits_row(current)], list(_limits_row(current)))
            return
        if clear and (rate is not None or cap is not None):
            raise CommandError("--clear resets both limits: give it alone, or --rate/--cap alone; nothing was changed")
        per_second = current.per_second if rate is None else limit_from_text(rate, "--rate", whole=False)
        in_flight = current.cap if cap is None else limit_from_text(cap, "--cap", whole=True)
        if clear:
            per_second = in_flight = None
        result = limits.set(outbox, name, per_second=per_second, cap=in_flight, actor=actor())
        row = {**_limits_row(result.limits), "result": "changed" if result.changed else f"unchanged: {result.reason}",
               "audit_id": result.audit_id or "-"}
        output.emit(result.model_dump(mode="json"), [row], list(row))


def _limits_row(limits: "DestinationLimitsModel") -> dict[str, Any]:
    own_rate = f"{limits.default_per_second:g}/s" if limits.default_per_second is not None else "none"
    return {
        "outbox": limits.outbox,
        "destination": limits.destination,
        "rate": f"{limits.per_second:g}/s" if limits.per_second is not None else f"outbox's own ({own_rate})",
        "cap": limits.cap if limits.cap is not None else f"outbox's own ({limits.default_cap} while failing)",
        "set_by": limits.updated_by or "-",
    }
