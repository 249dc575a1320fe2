"""``outboxkit subscriptions``: the subscriptions of events from a shell, through the operations layer.

::

    outboxkit subscriptions list --tenant acme
    outboxkit subscriptions show 12                                # the row (secrets counted) and its changes
    outboxkit subscriptions create --url https://hooks.example.com/in --event-type 'invoice.*' \\
        --secret whsec_... --tenant acme --header "X-Customer: 7" --rate-limit 10 --max-in-flight 2
    outboxkit subscriptions disable 12 --reason "the customer asked"
    outboxkit subscriptions enable 12
    outboxkit subscriptions delete 12 --yes
    outboxkit subscriptions replay 12 --since 2026-11-28T00:00:00+00:00 --dry-run   # past events, counted first

Each change is one transaction, audited as ``cli:<user>@<host>``; the endpoint passes the URL guard with the
settings' allow-list.  A refusal names the field (``outboxkit: url: ... is a private address ...``, exit 1) and
writes nothing.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
import dataclasses
from datetime import datetime
from typing import Annotated, Any

import typer

from outboxkit.cli.application import CommandError, actor, operating
from outboxkit.cli.output import Output, age

__all__ = ["app"]

app = typer.Typer(name="subscriptions", help="Subscriptions of events: list, show, create, enable, disable, delete, replay.",
                  no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Id = Annotated[int, typer.Argument(help="The subscription's id.", show_default=False)]


def _row(subscription: Any) -> dict[str, str]:
    return {
        "id": str(subscription.id),
        "url": subscription.url,
        "event_types": ", ".join(subscription.event_types),
        "tenant": subscription.tenant or "-",
        "enabled": "yes" if subscription.enabled else f"no ({subscription.disabled_reason})",
        "secrets": str(subscription.secret_count),
        "limits": _limits(subscription),
        "changed": f"{age(subscription.changed_at)} by {subscription.changed_by}",
    }


def _limits(subscription: Any) -> str:
    """Its own limits (``-``: the deliveries outbox's own)."""
    shown = []
    if subscription.rate_limit is not None:
        shown.append(f"{subscription.rate_limit:g}/s")
    if subscription.max_in_flight is not None:
        shown.append(f"{subscription.max_in_flight} in flight")
    return ", ".join(shown) or "-"


def _emit(output: Output, subscriptions: list[Any]) -> None:
    rows = [_row(subscription) for subscription in subscriptions]
    document = [dataclasses.asdict(subscription) for subscription in subscriptions]
    output.emit(document, rows, ["id", "url", "event_types", "tenant", "enabled", "secrets", "limits", "changed"])


@app.command("list")
def list_subscriptions(
    context: typer.Context,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's.", show_default=False)] = None,
    json_output: JsonFlag = False,
) -> None:
    """Every subscription (of a tenant), by id: endpoint, filters, tenant, enabled, secrets counted."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        _emit(output, list(SubscriptionAdmin(kit).subscriptions(tenant=tenant)))


@app.command()
def show(context: typer.Context, subscription_id: Id, json_output: JsonFlag = False) -> None:
    """One subscription and its changes, newest first."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        subscriptions = SubscriptionAdmin(kit)
        _emit(output, [subscriptions.get(subscription_id)])
        changes = [{"at": entry["at"].isoformat(timespec="seconds"), "actor": entry["actor"], "action": entry["action"]}
                   for entry in subscriptions.changes(subscription_id)]
        if not output.json:
            output.table(changes, ["at", "actor", "action"])


@app.command()
def create(
    context: typer.Context,
    url: Annotated[str, typer.Option(help="The endpoint (http or https).", show_default=False)],
    event_type: Annotated[list[str], typer.Option(
        "--event-type", help="An event type (invoice.paid) or prefix (invoice.*); repeat.", show_default=False)],
    secret: Annotated[list[str], typer.Option(
        "--secret", help="A Standard Webhooks secret, whsec_...; repeat while rotating.", show_default=False)],
    tenant: Annotated[str | None, typer.Option(help="The tenant it belongs to.", show_default=False)] = None,
    header: Annotated[list[str] | None, typer.Option(
        "--header", metavar="'NAME: VALUE'", help="A custom header (repeat).", show_default=False)] = None,
    description: Annotated[str, typer.Option(help="Free text for operators.")] = "",
    rate_limit: Annotated[float | None, typer.Option(
        help="Its own requests per second (default: the deliveries outbox's own).", show_default=False)] = None,
    max_in_flight: Annotated[int | None, typer.Option(
        help="Its own most sends at once (default: the deliveries outbox's own).", show_default=False)] = None,
    json_output: JsonFlag = False,
) -> None:
    """Create a subscription; it receives the events published after it."""
    headers: dict[str, str] = {}
    for value in header or []:
        name, sign, text = value.partition(":")
        if not sign or not name.strip():
            raise typer.BadParameter(f"{value!r} is not 'NAME: VALUE'", param_hint="'--header'")
        headers[name.strip()] = text.strip()
    with operating(context, json_output) as (kit, output):
        from outboxkit.events.definitions import SubscriptionDefinition
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        definition = SubscriptionDefinition(
            url=url, event_types=event_type, secrets=secret, tenant=tenant, headers=headers, description=description,
            rate_limit=rate_limit, max_in_flight=max_in_flight,
        )
        _emit(output, [SubscriptionAdmin(kit).create(definition, actor=actor())])


@app.command()
def disable(
    context: typer.Context,
    subscription_id: Id,
    reason: Annotated[str, typer.Option(help="Why (shown to operators and on the held deliveries).", show_default=False)],
    json_output: JsonFlag = False,
) -> None:
    """Disable a subscription: no new deliveries; its pending ones are held until it is enabled."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        _emit(output, [SubscriptionAdmin(kit).disable(subscription_id, reason=reason, actor=actor())])


@app.command()
def enable(context: typer.Context, subscription_id: Id, json_output: JsonFlag = False) -> None:
    """Enable a subscription again; the deliveries its disable held are sent."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        _emit(output, [SubscriptionAdmin(kit).enable(subscription_id, actor=actor())])


@app.command()
def delete(
    context: typer.Context,
    subscription_id: Id,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm the delete.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Delete a subscription; its pending deliveries stay, stuck, and are never sent."""
    with operating(context, json_output) as (kit, output):
        if not yes:
            raise CommandError(f"deleting subscription {subscription_id} parks its pending deliveries for good; add --yes")
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        SubscriptionAdmin(kit).delete(subscription_id, actor=actor())
        output.emit({"deleted": subscription_id}, [{"deleted": str(subscription_id)}], ["deleted"])


def _moment(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise typer.BadParameter(f"{value!r} is not a time with its offset (2026-12-01T00:00:00+00:00)", param_hint=option)
    return moment


@app.command()
def replay(
    context: typer.Context,
    subscription_id: Id,
    since: Annotated[str, typer.Option(help="Events published from this time on (with its offset).", show_default=False)],
    until: Annotated[str | None, typer.Option(help="Up to this time, exclusive (default: now).", show_default=False)] = None,
    event_type: Annotated[list[str] | None, typer.Option(
        "--event-type", help="Only this type or prefix (repeat); within the subscription's own.", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count the events only; nothing is written.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Send stored past events again to one subscription (its filters and tenant), audited; --dry-run counts them."""
    start, end = _moment(since, "'--since'"), _moment(until, "'--until'")
    assert start is not None  # --since is required
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.subscription_admin import SubscriptionAdmin

        result = SubscriptionAdmin(kit).replay(
            subscription_id, since=start, until=end, event_types=event_type or None, dry_run=dry_run, actor=actor()
        )
        document = dataclasses.asdict(result)
        output.emit(document, [{key: str(value) for key, value in document.items()}],
                    ["subscription_id", "events", "enqueued", "dry_run"])
