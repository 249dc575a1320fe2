"""``outboxkit schedules``: schedule rows from a shell, through the same operations as the admin.

::

    outboxkit schedules list --tz Europe/Berlin                    # next fire time (its zone and yours), last run
    outboxkit schedules list --limit 100 --cursor <more: ...>      # the next page (50 by default, at most 200)
    outboxkit schedules show partner.heartbeat --outcome missed     # facts, next five fire times, history, changes
    outboxkit schedules create partner.heartbeat --trigger every --field minutes=5 \\
        --url https://partner.example/heartbeat --outbox scheduled-calls --header "X-Source: shop" --body '{"alive": true}'
    outboxkit schedules create billing.nightly --trigger cron --field hour=3 --field minute=30 \\
        --timezone Europe/Berlin --job expire-trials --grace 3600
    outboxkit schedules create billing.nightly --file nightly.json # the API's JSON (POST /api/schedules/new); - for stdin
    outboxkit schedules edit billing.nightly --field hour=4 --field minute=0     # the flags given replace those fields
    outboxkit schedules enable|disable|run-now billing.nightly
    outboxkit schedules delete billing.nightly --yes

Each change goes through ``outboxkit.operations.schedule_admin`` on the
operator database: one transaction, audited as ``cli:<user>@<host>``, that
wakes every process's schedule runner (NOTIFY).  A refused definition names
the field (``outboxkit: trigger.timezone: unknown IANA timezone ...``, exit
1) and writes nothing.  A job target must name a job registered on the
application's kit (``kit.schedules``) or one that a schedule row already
targets (see the operations module).  ``edit`` starts from the schedule as it is: ``--field`` replaces
the trigger's fields when given (with ``--trigger``, the kind too), and so
on for each flag.
"""

# No ``from __future__ import annotations``: typer reads the commands' annotations at runtime.
import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from outboxkit.cli.application import CommandError, actor, operating
from outboxkit.cli.output import Output, age

__all__ = ["app"]

app = typer.Typer(name="schedules", help="Schedule rows: list, show, create, edit, enable, disable, run now, delete.",
                  no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Name = Annotated[str, typer.Argument(help="The schedule's name.", show_default=False)]
Zone = Annotated[str, typer.Option("--tz", help="Your IANA timezone, for each fire time's second column.")]
Trigger = Annotated[str | None, typer.Option(help="cron, every, calendar_interval or once.", show_default=False)]
Fields = Annotated[list[str] | None, typer.Option(
    "--field", metavar="NAME=VALUE", help="A trigger field, e.g. minute=*/5 (repeat; replaces every field).", show_default=False)]
Timezone = Annotated[str | None, typer.Option(help="The trigger's IANA timezone (default UTC).", show_default=False)]
Job = Annotated[str | None, typer.Option(help="Target: a job registered in code.", show_default=False)]
Url = Annotated[str | None, typer.Option(help="Target: an HTTP request to this URL.", show_default=False)]
Outbox = Annotated[str | None, typer.Option(help="The ScheduledRequestOutbox that carries it.", show_default=False)]
Method = Annotated[str | None, typer.Option(help="The request's method (default POST).", show_default=False)]
Headers = Annotated[list[str] | None, typer.Option(
    "--header", metavar="'NAME: VALUE'", help="A request header (repeat; replaces every header).", show_default=False)]
Body = Annotated[str | None, typer.Option(help="The request's JSON body.", show_default=False)]
Grace = Annotated[int | None, typer.Option("--grace", help="Misfire grace in seconds.", show_default=False)]
MaxRunning = Annotated[int | None, typer.Option(help="Runs at once across processes.", show_default=False)]
Rerun = Annotated[bool | None, typer.Option(
    "--rerun-if-abandoned/--no-rerun-if-abandoned", help="Re-run an abandoned run once.", show_default=False)]
Enabled = Annotated[bool | None, typer.Option("--enabled/--disabled", help="Enabled (the default) or not.", show_default=False)]
File = Annotated[str | None, typer.Option(
    "--file", metavar="PATH", help="The definition as the API's JSON (- for stdin); flags given too override it.",
    show_default=False)]


def _pairs(values: list[str], separator: str, what: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for value in values:
        name, sign, text = value.partition(separator)
        if not sign or not name.strip():
            raise typer.BadParameter(f"{value!r} is not {what}", param_hint=f"'--{'field' if separator == '=' else 'header'}'")
        text = text.strip()
        found[name.strip()] = int(text) if separator == "=" and text.lstrip("-").isdigit() and text.isascii() else text
    return found


def _document(base: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a file, or the schedule as it is) with the flags given laid over it."""
    document: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy
    trigger = document.setdefault("trigger", {})
    if options["trigger"] is not None:
        trigger["kind"] = options["trigger"]
    if options["field"] is not None:
        trigger["fields"] = _pairs(options["field"], "=", "NAME=VALUE")
    if options["timezone"] is not None:
        trigger["timezone"] = options["timezone"]
    target = document.get("target") or {}
    if options["job"] is not None:
        target = {"kind": "job", "job": options["job"]}
    elif options["url"] is not None and target.get("kind") != "http":
        target = {"kind": "http"}
    if target.get("kind") == "http":
        for flag, key in (("url", "url"), ("outbox", "outbox"), ("method", "method")):
            if options[flag] is not None:
                target[key] = options[flag]
        if options["header"] is not None:
            target["headers"] = _pairs(options["header"], ":", "'NAME: VALUE'")
        if options["body"] is not None:
            try:
                target["body"] = json.loads(options["body"])
            except ValueError as exc:
                raise typer.BadParameter(f"not JSON: {exc}", param_hint="'--body'") from None
    if target:
        document["target"] = target
    for flag, key in (("grace", "misfire_grace_seconds"), ("max_running", "max_running"),
                      ("rerun", "rerun_if_abandoned"), ("enabled", "enabled")):
        if options[flag] is not None:
            document[key] = options[flag]
    return document


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        document = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CommandError(f"--file {path}: {exc}") from None
    if not isinstance(document, dict):
        raise CommandError(f"--file {path}: the definition must be a JSON object")
    return document


def _refused(error: ValidationError) -> CommandError:
    problems = [f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}" for problem in error.errors()]
    return CommandError("; ".join(problems))


def _show_result(output: Output, result: Any) -> None:
    schedule = result.schedule
    row = {"schedule": result.name, "action": result.action}
    if schedule is not None:
        row["enabled"] = "yes" if schedule.definition.enabled else "no"
        row["next_run"] = schedule.next_run_at.isoformat(timespec="seconds") if schedule.next_run_at else "-"
    output.emit(result.model_dump(mode="json"), [row], list(row))


@app.command("list")
def list_schedules(
    context: typer.Context,
    tz: Zone = "UTC",
    limit: Annotated[int, typer.Option(min=1, max=200, help="Schedules per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Continue after a previous page.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Schedules by name, a page at a time: trigger, target, next fire time (its zone and --tz), last run."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.schedule_admin import ScheduleAdmin

        view = ScheduleAdmin(kit).overview(viewer_timezone=tz, cursor=cursor, limit=limit)
        rows = []
        for schedule in view.schedules:
            first = schedule.next_fire_times[0] if schedule.next_fire_times else None
            target = schedule.definition.target
            rows.append({
                "name": schedule.name,
                "enabled": "yes" if schedule.definition.enabled else "no",
                "trigger": schedule.description,
                "target": f"job {target.job}" if target.kind == "job" else f"{target.method} {target.url}",
                "next": first.local.isoformat(timespec="seconds") if first else "-",
                f"next ({tz})": first.viewer.isoformat(timespec="seconds") if first else "-",
                "last_run": f"{age(schedule.last_run.started_at)} {schedule.last_run.outcome}" if schedule.last_run else "never",
            })
        columns = ["name", "enabled", "trigger", "target", "next", f"next ({tz})", "last_run"]
        output.emit(view.model_dump(mode="json"), rows, columns)
        if view.next_cursor:
            output.say(f"more: --cursor {view.next_cursor}")


@app.command()
def show(
    context: typer.Context,
    name: Name,
    tz: Zone = "UTC",
    outcome: Annotated[list[str] | None, typer.Option(help="Only these outcomes in the history (repeat).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="History entries.")] = 20,
    json_output: JsonFlag = False,
) -> None:
    """One schedule: its definition, next five fire times, history (newest first) and changes."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.schedule_admin import ScheduleAdmin

        schedules = ScheduleAdmin(kit)
        schedule = schedules.schedule(name, viewer_timezone=tz)
        history = schedules.history(name, outcomes=outcome, limit=limit)
        changes = schedules.audit(name, limit=limit)
        if output.json:
            print(json.dumps({"schedule": schedule.model_dump(mode="json"), "history": history.model_dump(mode="json"),
                              "changes": [entry.model_dump(mode="json") for entry in changes]}))
            return
        definition = schedule.definition
        output.say(f"{schedule.name}: {schedule.description}, {'enabled' if definition.enabled else 'disabled'}; "
                   f"grace {definition.misfire_grace_seconds} s, running limit {definition.max_running}; "
                   f"changed by {schedule.changed_by} {age(schedule.changed_at)}")
        output.table([{"at": time.local.isoformat(timespec="seconds"), f"in {tz}": time.viewer.isoformat(timespec="seconds")}
                      for time in schedule.next_fire_times], ["at", f"in {tz}"])
        output.table([{"fire_time": run.scheduled_for.isoformat(timespec="seconds"), "outcome": run.outcome,
                       "error": (run.error or "")[:120], "process": run.holder} for run in history.runs],
                     ["fire_time", "outcome", "error", "process"])
        output.table([{"when": entry.at.isoformat(timespec="seconds"), "who": entry.actor, "what": entry.action}
                      for entry in changes], ["when", "who", "what"])


DEFINITION_OPTIONS: dict[str, Any] = {
    "file": File, "trigger": Trigger, "field": Fields, "timezone": Timezone, "job": Job, "url": Url, "outbox": Outbox,
    "method": Method, "header": Headers, "body": Body, "grace": Grace, "max_running": MaxRunning, "rerun": Rerun,
    "enabled": Enabled,
}


def with_definition_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with ``DEFINITION_OPTIONS`` added to its options; it receives them as one ``options`` dict."""
    signature = inspect.signature(command)
    own = [parameter for parameter in signature.parameters.values() if parameter.name != "options"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in DEFINITION_OPTIONS.items()
    ]

    @functools.wraps(command)
    def with_options(**given: Any) -> None:
        options = {name: given.pop(name) for name in DEFINITION_OPTIONS}
        command(**given, options=options)

    with_options.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    with_options.__annotations__ = {parameter.name: parameter.annotation for parameter in own + added}
    return with_options


@app.command()
@with_definition_options
def create(context: typer.Context, name: Name, options: dict[str, Any], json_output: JsonFlag = False) -> None:
    """Create a schedule from flags or --file (the API's JSON); a refused field is named and nothing is written."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.schedule_admin import ScheduleAdmin
        from outboxkit.operations.schedule_schemas import ScheduleCreate

        document = _document(_read_file(options["file"]) if options["file"] else {}, options)
        try:
            request = ScheduleCreate.model_validate({**document, "name": name})
        except ValidationError as exc:
            raise _refused(exc) from None
        _show_result(output, ScheduleAdmin(kit).create(request, actor=actor()))


@app.command()
@with_definition_options
def edit(context: typer.Context, name: Name, options: dict[str, Any], json_output: JsonFlag = False) -> None:
    """Change a schedule: the flags given (or --file) replace those parts; the rest stays as it is."""
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.schedule_admin import ScheduleAdmin
        from outboxkit.operations.schedule_schemas import ScheduleFields

        schedules = ScheduleAdmin(kit)
        base = _read_file(options["file"]) if options["file"] else schedules.schedule(name).definition.model_dump(mode="json")
        try:
            request = ScheduleFields.model_validate(_document(base, options))
        except ValidationError as exc:
            raise _refused(exc) from None
        _show_result(output, schedules.edit(name, request, actor=actor()))


def _simple(action: str, summary: str) -> None:
    def command(context: typer.Context, name: Name, json_output: JsonFlag = False) -> None:
        with operating(context, json_output) as (kit, output):
            from outboxkit.operations.schedule_admin import ScheduleAdmin

            perform = getattr(ScheduleAdmin(kit), action.replace("-", "_"))
            _show_result(output, perform(name, actor=actor()))

    command.__doc__ = summary
    app.command(action)(command)


_simple("enable", "Enable a schedule: it fires from its next fire time after now.")
_simple("disable", "Disable a schedule: no process fires it (occurrences meanwhile are skipped).")
_simple("run-now", "Make a schedule due now: one occurrence at this instant, then its own times.")


@app.command()
def delete(
    context: typer.Context,
    name: Name,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete (without it, nothing happens).")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Delete a schedule (asks for --yes); its history and audit stay."""
    if not yes:
        raise typer.BadParameter("deleting a schedule stops it in every process: pass --yes to delete it", param_hint="'--yes'")
    with operating(context, json_output) as (kit, output):
        from outboxkit.operations.schedule_admin import ScheduleAdmin

        _show_result(output, ScheduleAdmin(kit).delete(name, actor=actor()))
