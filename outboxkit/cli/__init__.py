"""The ``outboxkit`` command line: what an operator does from a shell.

::

    outboxkit demo                                            # the example service, end to end
    outboxkit --app myapp.outbox:kit status                   # counts, oldest due, last drain, leader
    outboxkit --app myapp.outbox:kit stuck credit-grants --error-contains timeout
    outboxkit --app myapp.outbox:kit reset credit-grants 41 42
    outboxkit --app myapp.outbox:kit reset credit-grants --all --status-code 422 --dry-run
    outboxkit --app myapp.outbox:kit blocked orders           # an ordered outbox's stuck heads, rows behind each
    outboxkit --app myapp.outbox:kit skip orders 41           # row 41 stays stuck; its key's next rows go
    outboxkit --app myapp.outbox:kit discard credit-grants --all --status-code 410 --dry-run   # kept, never sent
    outboxkit --app myapp.outbox:kit drain --once             # one batch of every outbox
    outboxkit --app myapp.outbox:kit jobs --json              # scheduled jobs, last runs, leader
    outboxkit --app myapp.outbox:kit destinations             # each destination's state, failures, rows waiting
    outboxkit --app myapp.outbox:kit destinations resume https://billing.internal:443 --outbox webhooks
    outboxkit --app myapp.outbox:kit replay webhooks --delivered-after 2030-01-01T00:00 --yes
    outboxkit --app myapp.outbox:kit export webhooks --status stuck --format csv > stuck.csv
    outboxkit --app myapp.outbox:kit schedules list --tz Europe/Berlin   # schedule rows (show, create, edit, ...)
    outboxkit --app myapp.outbox:kit worker                   # drains and fires schedule rows (until SIGTERM)
    outboxkit --install-completion                            # tab completion for your shell

Built on typer (commands, options, help, shell completion) and rich (tables).
Commands that act on an application's outboxes find its kit by an import
path (``--app module:attribute`` or ``$OUTBOXKIT_APP``, before or after the
command); the attribute is an ``OutboxKit`` or a function returning one.  Output is a table for people
(coloured on a terminal unless ``NO_COLOR`` is set; plain, unwrapped text when
piped) and ``--json`` for scripts, before or after the command.  Exit codes:
0 done, 1 failed (one ``outboxkit: ...`` line on stderr), 2 usage error.
``status``, ``stuck``, ``reset`` and ``jobs`` act through the same service as
the admin (``outboxkit.operations``: a reset is audited and wakes the drain,
and a row a drain holds is refused); none of them needs the ``admin`` extra.

The commands are here, except ``replay`` and ``export`` (every row a
filter matches), which are ``outboxkit.cli.bulk_commands``,
``destinations``, which is ``outboxkit.cli.destination_commands``, ``blocked``
and ``skip`` (ordered keys), which are ``outboxkit.cli.ordered_commands``, ``schedules``
(schedule rows), which is ``outboxkit.cli.schedule_commands``, ``inbox``, which is
``outboxkit.cli.inbox_commands``, and ``subscriptions`` (subscriptions of events), which is
``outboxkit.cli.subscription_commands``; finding the application's kit and turning failures
into one line is ``outboxkit.cli.application``; tables and JSON are
``outboxkit.cli.output``.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from outboxkit.cli import (
    bulk_commands,
    destination_commands,
    inbox_commands,
    ordered_commands,
    schedule_commands,
    subscription_commands,
)
from outboxkit.cli.application import CommandError, GlobalOptions, actor, admin_service, operating
from outboxkit.cli.output import age, fail
from outboxkit.errors import RowsHeld, RowsNotFound

if TYPE_CHECKING:
    from outboxkit.operations.schemas import RowFilter

__all__ = ["app", "app_option_first", "main"]

MAX_ROW_ID = 2**63 - 1

app = typer.Typer(
    name="outboxkit",
    help="Operate outboxkit outboxes from a shell.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # an unexpected traceback must not print a database password
    context_settings={"help_option_names": ["-h", "--help"]},
)


# --- options every command shares ----------------------------------------------------------------------------------


JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output (also accepted before the command).")]
OutboxName = Annotated[str, typer.Argument(help="The outbox's job name.", show_default=False)]
ErrorContains = Annotated[str | None, typer.Option(help="Only rows whose last error contains this text.")]
StatusCode = Annotated[int | None, typer.Option(min=100, max=599, help="Only rows whose last HTTP status is this.")]


def row_id(value: str) -> int:
    """A row id from the command line: ASCII digits, 1 to 2^63-1 (the ``bigint`` primary key)."""
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_ROW_ID:
        raise typer.BadParameter(f"{value!r} is not a row id (1 to 2^63-1)")
    return int(value)


RowIds = Annotated[list[int] | None, typer.Argument(parser=row_id, show_default=False, help="Row ids (or --all).")]
AllMatching = Annotated[bool, typer.Option("--all", help="Every stuck row matching the filters.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="With --all: count and sample, change nothing.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="With --all: do not ask for confirmation.")]


def ids_or_all(verb: str, ids: list[int] | None, all_matching: bool, *, filtered: bool) -> None:
    """Refuse a command given both row ids and ``--all``, or neither, or ``--all``'s options with ids."""
    if all_matching == bool(ids):
        raise typer.BadParameter(f"name row ids, or pass --all (with optional filters) to {verb} every matching "
                                 "stuck row", param_hint="'IDS' / '--all'")
    if ids and filtered:
        raise typer.BadParameter("--dry-run, --yes and the filters go with --all, not with row ids",
                                 param_hint="'IDS'")


@app.callback()
def global_options(
    context: typer.Context,
    app_path: Annotated[str | None, typer.Option(
        "--app", envvar="OUTBOXKIT_APP", metavar="MODULE:ATTRIBUTE", show_envvar=True,
        help="Import path of the application's kit (an OutboxKit or a function returning one), e.g. myapp.outbox:kit.",
    )] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Operate outboxkit outboxes from a shell: status, stuck rows, resets, drains, jobs, workers."""
    context.obj = GlobalOptions(app_path=app_path, json=json_output)


def row_filter(error_contains: str | None, status_code: int | None) -> RowFilter:
    from outboxkit.operations.schemas import RowFilter

    return RowFilter(error_contains=error_contains, status_code=status_code)


# --- the commands --------------------------------------------------------------------------------------------------


@app.command()
def status(context: typer.Context, json_output: JsonFlag = False) -> None:
    """Per outbox: counts, oldest due row, last drain; and the leader."""
    with operating(context, json_output) as (kit, output):
        overview = admin_service(kit).overview()
        rows = []
        for outbox in overview.outboxes:
            counts, last = outbox.counts, outbox.last_drain
            rows.append({
                "outbox": outbox.name,
                "pending": f"~{counts.pending}" if counts.pending_estimated else counts.pending,
                "in_flight": counts.in_flight,
                "held_by_dest": f"{outbox.held_by_destination}{'+' if outbox.held_by_destination_at_least else ''}",
                "held_by_order": "-" if counts.held_by_order is None else counts.held_by_order,
                "stuck": f"~{counts.stuck}" if counts.stuck_estimated else counts.stuck,
                "done": f"~{counts.done}" if counts.done_estimated else counts.done,
                "discarded": f"{counts.discarded}+" if counts.discarded_estimated else counts.discarded,
                "oldest_due": age(outbox.oldest_due_at),
                "last_drain": f"{age(last.started_at)} {last.outcome}" if last else "never",
            })
        output.emit(overview.model_dump(mode="json"), rows,
                    ["outbox", "pending", "in_flight", "stuck", "held_by_dest", "held_by_order", "done", "discarded",
                     "oldest_due", "last_drain"])
        for held in overview.held_back:  # unhealthy destinations, what they hold: disabled first, the most rows first
            rows_held = f"{held.waiting_rows}{'+' if held.waiting_rows_at_least else ''}"
            until = "until resumed" if held.state == "disabled" else f"until {age(held.until)}"
            output.say(f"{held.outbox} {held.destination}: {held.state.replace('_', '-')}, holds {rows_held} row(s), {until}",
                       style="bold yellow")
        leader = overview.leader
        output.say(f"leader: {leader.host} pid {leader.pid} (since {age(leader.since)})" if leader else "leader: none",
                   style="" if leader else "yellow")
        if len(overview.leaders) > 1:
            output.warn(f"WARNING: {len(overview.leaders)} sessions hold the leader lock")


@app.command()
def stuck(
    context: typer.Context,
    outbox: OutboxName,
    error_contains: ErrorContains = None,
    status_code: StatusCode = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="Rows per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Continue after a previous page.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """List the stuck rows of one outbox, with their last status code and error."""
    with operating(context, json_output, [outbox]) as (kit, output):
        page = admin_service(kit).rows(outbox, status="stuck", row_filter=row_filter(error_contains, status_code),
                                       cursor=cursor, limit=limit)
        rows = [
            {"id": row.id, "attempts": row.attempts, "status_code": row.last_status_code or "-",
             "updated": age(row.updated_at), "last_error": (row.last_error or "").replace("\n", " ")[:100]}
            for row in page.rows
        ]
        output.emit(page.model_dump(mode="json"), rows, ["id", "attempts", "status_code", "updated", "last_error"])
        if page.next_cursor:
            output.say(f"more: --cursor {page.next_cursor}")


@app.command()
def reset(
    context: typer.Context,
    outbox: OutboxName,
    ids: RowIds = None,
    all_matching: AllMatching = False,
    error_contains: ErrorContains = None,
    status_code: StatusCode = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    retry_now: Annotated[bool, typer.Option("--retry-now", help="With ids: make pending rows in backoff due now.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Reset stuck or discarded rows to pending (audited; wakes the drain), or retry pending rows in backoff now."""

    ids_or_all("reset", ids, all_matching, filtered=dry_run or yes or error_contains is not None or status_code is not None)
    if all_matching and retry_now:
        raise typer.BadParameter("--retry-now takes row ids, not --all", param_hint="'--retry-now'")
    act_on_stuck_rows(context, outbox, ids, row_filter(error_contains, status_code), dry_run=dry_run, yes=yes,
                      json_output=json_output, action="retry_now" if retry_now else "reset")


@app.command()
def discard(
    context: typer.Context,
    outbox: OutboxName,
    ids: RowIds = None,
    all_matching: AllMatching = False,
    error_contains: ErrorContains = None,
    status_code: StatusCode = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    json_output: JsonFlag = False,
) -> None:
    """Discard stuck rows that can never be delivered: kept as discarded, never sent, out of the stuck count
    (audited; `outboxkit reset` brings them back)."""

    ids_or_all("discard", ids, all_matching, filtered=dry_run or yes or error_contains is not None or status_code is not None)
    act_on_stuck_rows(context, outbox, ids, row_filter(error_contains, status_code), dry_run=dry_run, yes=yes,
                      json_output=json_output, action="discard")


def act_on_stuck_rows(
    context: typer.Context, outbox: str, ids: list[int] | None, filters: RowFilter, *, dry_run: bool, yes: bool,
    json_output: bool, action: Literal["reset", "retry_now", "discard"],
) -> None:
    """``reset`` and ``discard``: the rows named, or every stuck row matching ``filters`` (a dry run, a prompt)."""
    verb = "discard" if action == "discard" else "reset"
    with operating(context, json_output, [outbox]) as (kit, output):
        service = admin_service(kit)
        if ids:
            perform = {"reset": service.reset, "retry_now": service.retry_now, "discard": service.discard}[action]
            try:
                result = perform(outbox, ids, actor=actor())
            except (RowsHeld, RowsNotFound) as exc:
                raise CommandError(str(exc)) from None
            rows = [{"id": changed, "result": "changed"} for changed in result.changed_ids]
            rows += [{"id": skipped.id, "result": f"skipped: {skipped.reason}"} for skipped in result.skipped]
            output.emit(result.model_dump(mode="json"), rows, ["id", "result"])
            return
        discarding = action == "discard"
        preview = service.reset_matching(outbox, filters, dry_run=True, actor=actor(), discard=discarding)
        matched = f"{preview.matched}{'+' if preview.matched_at_least else ''}"  # counted up to 10,000
        if dry_run:
            output.emit(preview.model_dump(mode="json"), [{"matched": matched,
                        "sample_ids": " ".join(map(str, preview.sample_ids))}], ["matched", "sample_ids"])
            return
        if not yes:
            if not sys.stdin.isatty():
                raise CommandError(f"{matched} stuck row(s) match; pass --yes to {verb} them without a prompt")
            if not typer.confirm(f"{verb} {matched} stuck row(s) of {outbox}?", default=False):
                output.say("nothing changed")
                raise typer.Exit(1)
        # In batches of 1,000, each its own transaction; a shell has no request to keep short, so it runs to the end.
        outcome = service.reset_matching(outbox, filters, dry_run=False, actor=actor(), max_seconds=None,
                                         discard=discarding)
        done = "discarded" if discarding else "reset"
        output.emit(outcome.model_dump(mode="json"), [{"matched": matched, done: outcome.changed,
                    "batches": outcome.batches, "audit_id": outcome.audit_id}], ["matched", done, "batches", "audit_id"])


app.command("replay")(bulk_commands.replay)
app.command("export")(bulk_commands.export)
app.add_typer(destination_commands.destinations)
app.command("blocked")(ordered_commands.blocked)
app.command("skip")(ordered_commands.skip)
app.add_typer(schedule_commands.app, name="schedules")
app.command("inbox")(inbox_commands.inbox)
app.add_typer(subscription_commands.app, name="subscriptions")


@app.command()
def jobs(context: typer.Context, json_output: JsonFlag = False) -> None:
    """Scheduled jobs with their next and last run, and the leader."""
    with operating(context, json_output) as (kit, output):
        view = admin_service(kit).jobs()
        rows = [
            {"id": job.id, "name": job.name, "schedule": job.schedule or job.trigger or "-",
             "next_run": job.next_run_at.isoformat(timespec="seconds") if job.next_run_at else "-",
             "last_run": f"{age(job.last_run.started_at)} {job.last_run.outcome}" if job.last_run else "never"}
            for job in view.jobs
        ]
        output.emit(view.model_dump(mode="json"), rows, ["id", "name", "schedule", "next_run", "last_run"])
        output.say(f"leader: {view.leader.host} pid {view.leader.pid}" if view.leader else "leader: none",
                   style="" if view.leader else "yellow")


@app.command()
def drain(
    context: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="One batch per outbox instead of until none is due.")] = False,
    outbox: Annotated[str | None, typer.Option(metavar="NAME", help="Only this outbox (its job name).")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Deliver due rows now, from this shell (exit 1 if a drain failed)."""
    with operating(context, json_output, [outbox] if outbox else []) as (kit, output):
        names = [outbox] if outbox else [registered.__outbox__.job_name for registered in kit.outboxes]
        results = []
        for name in names:
            drainer = kit.drainer(name)
            result = drainer.drain_once() if once else drainer.drain()
            results.append({"outbox": name, **result.as_counts(), "error": result.error or ""})
        output.emit(results, results, ["outbox", "claimed", "delivered", "retried", "stuck", "error"])
        if any(result["error"] for result in results):
            raise typer.Exit(1)


@app.command()
def worker(
    context: typer.Context,
    outboxes: Annotated[list[str] | None, typer.Option(
        "--outbox", metavar="NAME", show_default=False,
        help="Only this outbox (repeat for several; default: every outbox of the kit).")] = None,
    scheduler: Annotated[bool, typer.Option(
        "--scheduler", help="Also campaign for leadership and run the schedule when elected.")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", metavar="PORT", min=0, max=65535, show_default=False,
        help="Serve /metrics, /healthz and /readyz on this port (0: any free port, logged; needs the metrics extra).")] = None,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", help="Address for --metrics-port.")] = "127.0.0.1",
) -> None:
    """Drain and fire schedule rows in the foreground until SIGTERM or SIGINT (exit 0 on a clean stop).

    The schedule rows' trigger loop runs as in the lifespan (``OUTBOXKIT_SCHEDULES_ENABLED``):
    the schedules declared on the kit are synced, and this process fires its share of the due rows.
    """
    import logging

    from outboxkit.drain.worker import DrainWorker
    from outboxkit.integration import LOG_FORMAT, readiness, start_schedules, stop_schedules
    from outboxkit.metrics.prometheus import serve_worker_metrics

    with operating(context, False, outboxes or []) as (kit, _):
        if not logging.getLogger().handlers:  # the application did not configure logging: say what happens
            logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        drain_worker = DrainWorker(kit, outboxes=outboxes or None)
        if scheduler:
            kit.scheduler.elect()  # campaign too: this process may lead and run the schedule
        start_schedules(kit.schedules, enabled=kit.settings.schedules_enabled, where="the worker")
        try:
            # No-op without --metrics-port; with it, the port also answers /healthz and /readyz (the drain
            # loops, the database and, unless OUTBOXKIT_SCHEDULES_ENABLED=false, the schedule loop).
            ready = functools.partial(readiness, kit, drains=drain_worker.readiness)
            with serve_worker_metrics(kit, port=metrics_port, host=metrics_host, readiness=ready):
                drain_worker.run_until_stopped()
        finally:
            stop_schedules(kit.schedules)  # its runs record their outcome before the kit closes its engine


# The demo's own options (argparse, in admin/exampleapp/demo.py) pass through untouched, --help included.
@app.command(add_help_option=False, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def demo(context: typer.Context) -> None:
    """Run the example service end to end (the repository's exampleapp, installed; its options: demo --help)."""
    try:
        example = importlib.import_module("exampleapp.demo")
    except ModuleNotFoundError as missing:
        if missing.name not in ("exampleapp", "exampleapp.demo"):
            raise
        fail("the demo is the example service of the outboxkit repository, not part of the library; "
             "in a clone, install it with `pip install -e ./admin` (README, quick start), then run `outboxkit demo`")
    raise typer.Exit(int(example.main(list(context.args))))


def app_option_first(args: Sequence[str]) -> list[str]:
    """``args`` with every ``--app`` given after the command moved before it, where the command line reads it.

    ``--app`` names the application for every command, so ``outboxkit worker --app myapp:kit`` means what
    ``outboxkit --app myapp:kit worker`` means; nothing after a ``--`` is touched.
    """
    words, moved = list(args), []
    index = 0
    while index < len(words) and words[index] != "--":
        word = words[index]
        if word == "--app" and index + 1 < len(words):
            moved += words[index:index + 2]
            del words[index:index + 2]
        elif word.startswith("--app="):
            moved.append(words.pop(index))
        else:
            index += 1
    return moved + words


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); the exit code: 0 ok, 1 failure, 2 usage."""
    try:
        app(args=app_option_first(sys.argv[1:] if argv is None else argv), prog_name="outboxkit")
    except SystemExit as exit_request:  # typer ends every run with one; hand its code back to the caller
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
