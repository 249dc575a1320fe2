"""``outboxkit replay`` and ``outboxkit export``: commands over every row a filter matches.

::

    outboxkit replay webhooks --delivered-after 2030-01-01T00:00 --delivered-before 2030-01-02T00:00   # dry run: count
    outboxkit replay webhooks --delivered-after 2030-01-01T00:00 --yes --batch-size 200                 # replay them
    outboxkit export webhooks --status stuck --format csv > stuck.csv
    outboxkit export webhooks --payload-column event --payload-contains refund --output refunds.ndjson

Both take the rows listing's filters (``--error-contains``, ``--status-code``,
``--created-after``/``--created-before``, ``--updated-*``, ``--delivered-*``,
``--attempts-min``/``--attempts-max``, ``--payload-column`` with
``--payload-contains``); a time without an offset is UTC.  They run through
the same service as the admin (``outboxkit.operations.replay`` and
``.export``): a replay is audited as ``cli:<user>@<host>`` and wakes the
drains; an export streams batch by batch in constant memory.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
import functools
import inspect
import sys
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer

from outboxkit.cli.application import CommandError, actor, admin_service, operating
from outboxkit.storage.row_filter import RowFilter

__all__ = ["export", "replay"]


def moment(value: str) -> datetime:
    """A time from the command line: ISO 8601, UTC when it has no offset."""
    try:
        parsed = datetime.fromisoformat(value) if value.isascii() else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise typer.BadParameter(f"{value!r} is not a time like 2030-01-01T12:00 (UTC) or 2030-01-01T12:00+02:00")
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed


def _time(flag: str, meaning: str) -> typer.models.OptionInfo:
    return cast(typer.models.OptionInfo, typer.Option(flag, parser=moment, metavar="TIME", help=meaning, show_default=False))


OutboxName = Annotated[str, typer.Argument(help="The outbox's job name.", show_default=False)]
ErrorContains = Annotated[str | None, typer.Option(help="Only rows whose last error contains this text.")]
StatusCode = Annotated[int | None, typer.Option(min=100, max=599, help="Only rows whose last HTTP status is this.")]
CreatedAfter = Annotated[datetime | None, _time("--created-after", "created_at at or after this time.")]
CreatedBefore = Annotated[datetime | None, _time("--created-before", "created_at before this time.")]
UpdatedAfter = Annotated[datetime | None, _time("--updated-after", "updated_at at or after this time.")]
UpdatedBefore = Annotated[datetime | None, _time("--updated-before", "updated_at before this time.")]
DeliveredAfter = Annotated[datetime | None, _time("--delivered-after", "delivered_at at or after this time.")]
DeliveredBefore = Annotated[datetime | None, _time("--delivered-before", "delivered_at before this time.")]
AttemptsMin = Annotated[int | None, typer.Option(min=0, max=1_000_000, help="At least this many attempts.")]
AttemptsMax = Annotated[int | None, typer.Option(min=0, max=1_000_000, help="At most this many attempts.")]
PayloadColumn = Annotated[str | None, typer.Option(help="One of the outbox's own columns, for --payload-contains.")]
PayloadContains = Annotated[str | None, typer.Option(help="Only rows whose --payload-column, as text, contains this.")]


# The rows listing's filters, as options of every command that takes them (named as RowFilter's fields).
FILTER_OPTIONS: dict[str, Any] = {
    "error_contains": ErrorContains,
    "status_code": StatusCode,
    "created_after": CreatedAfter,
    "created_before": CreatedBefore,
    "updated_after": UpdatedAfter,
    "updated_before": UpdatedBefore,
    "delivered_after": DeliveredAfter,
    "delivered_before": DeliveredBefore,
    "attempts_min": AttemptsMin,
    "attempts_max": AttemptsMax,
    "payload_column": PayloadColumn,
    "payload_contains": PayloadContains,
}


def with_filter_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with ``FILTER_OPTIONS`` added to its options; it receives them as one ``filters: RowFilter``."""
    signature = inspect.signature(command)
    own = [parameter for parameter in signature.parameters.values() if parameter.name != "filters"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in FILTER_OPTIONS.items()
    ]

    @functools.wraps(command)
    def filtered(**options: Any) -> None:
        fields = {name: options.pop(name) for name in FILTER_OPTIONS}
        command(**options, filters=RowFilter(**fields))

    filtered.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    filtered.__annotations__ = {parameter.name: parameter.annotation for parameter in own + added}
    return filtered


@with_filter_options
def replay(
    context: typer.Context,
    outbox: OutboxName,
    filters: RowFilter,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count and sample, change nothing (the default).")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Replay the matching rows (without it: a dry run).")] = False,
    batch_size: Annotated[int, typer.Option(min=1, max=10_000, help="Rows per transaction.")] = 500,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Send delivered rows matching the filters again: a dry run (count) unless --yes (audited; wakes the drain)."""
    if dry_run and yes:
        raise typer.BadParameter("--dry-run only counts; --yes replays: pass one of them", param_hint="'--yes'")
    with operating(context, json_output, [outbox]) as (kit, output):
        replays = admin_service(kit).replays

        def progress(replayed: int, batches: int) -> None:
            if not output.json:
                print(f"replayed {replayed:,} row(s) in {batches} batch(es)", file=sys.stderr, flush=True)

        outcome = replays.replay(outbox, filters, actor=actor(), dry_run=not yes, batch_size=batch_size, progress=progress)
        matched = f"{outcome.matched:,}{'+' if outcome.matched_at_least else ''}"
        output.emit(outcome.model_dump(mode="json"), [{
            "matched": matched, "replayed": outcome.replayed, "batches": outcome.batches,
            "sample_ids": " ".join(map(str, outcome.sample_ids)),
        }], ["matched", "replayed", "batches", "sample_ids"])
        if not yes:
            output.say(f"dry run: {matched} delivered row(s) match; pass --yes to replay them")


@with_filter_options
def export(
    context: typer.Context,
    outbox: OutboxName,
    export_format: Annotated[str, typer.Option("--format", help="ndjson (one JSON object per line) or csv.")] = "ndjson",
    status: Annotated[str | None, typer.Option(help="Only this status: pending, done or stuck (default: every status).")] = None,
    output_path: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write to this file instead of standard output.", show_default=False)] = None,
    *,
    filters: RowFilter,
) -> None:
    """Stream the rows matching the filters as NDJSON or CSV (constant memory; CSV cells safe for spreadsheets)."""
    with operating(context, False, [outbox]) as (kit, _):
        chunks = admin_service(kit).exports.open(outbox, row_filter=filters, status=status, format=export_format)
        first = next(chunks, b"")  # refusals and an unreachable database fail here, before the file is created
        target: IO[bytes]
        with open(output_path, "wb") if output_path else nullcontext(sys.stdout.buffer) as target:
            try:
                sys.stdout.flush()
                target.write(first)
                for chunk in chunks:
                    target.write(chunk)
                target.flush()
            except BrokenPipeError:  # `outboxkit export ... | head`: the reader left, which is not a failure
                raise CommandError("the output was closed before the export ended") from None
