"""The ``outboxkit`` command line: what an operator does from a shell.

::

    outboxkit demo                                            # the example service, end to end
    outboxkit --app myapp.outbox:kit status                   # counts, oldest due, last drain, leader
    outboxkit --app myapp.outbox:kit stuck credit-grants --error-contains timeout
    outboxkit --app myapp.outbox:kit reset credit-grants 41 42
    outboxkit --app myapp.outbox:kit reset credit-grants --all --status-code 422 --dry-run
    outboxkit --app myapp.outbox:kit drain --once             # one batch of every outbox
    outboxkit --app myapp.outbox:kit jobs                     # scheduled jobs, last runs, leader
    outboxkit --app myapp.outbox:kit worker                   # a dedicated drainer process (until SIGTERM)

Commands that act on an application's outboxes find its kit by an import
path (``--app module:attribute`` or ``$OUTBOXKIT_APP``); the attribute is an
``OutboxKit`` or a function returning one.  Output is a table for people,
``--json`` for scripts; the exit code is non-zero on failure.  ``status``,
``stuck``, ``reset`` and ``jobs`` act through the same service as the admin
(so a reset is audited, and a row a drain holds is refused); they need the
``admin`` extra.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import os
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from outboxkit.errors import ConfigurationError, OutboxKitError
from outboxkit.kit import OutboxKit

if TYPE_CHECKING:
    from outboxkit.admin.service import AdminService

MIGRATION_HINT = (
    "run your migrations (`alembic upgrade heads`); the kit's own tables come from the `outboxkit` branch: "
    "add `outboxkit:migrations/versions` to version_locations (docs/operations.md)"
)

__all__ = ["main"]


class CommandError(Exception):
    """A failure to report in one line, with exit code 1 (2 for usage)."""


def load_kit(path: str | None) -> OutboxKit:
    if not path:
        raise CommandError("say which application: --app module:attribute (or set OUTBOXKIT_APP)")
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"--app {path!r} must look like 'package.module:kit'")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import {module_name!r}: {exc}") from None
    target = getattr(module, attribute, None)
    if target is None:
        raise CommandError(f"{module_name!r} has no attribute {attribute!r}")
    if callable(target) and not isinstance(target, OutboxKit):
        try:
            kit = target()
        except Exception as exc:  # the application's factory: report it in one line
            raise CommandError(f"{path}() failed: {type(exc).__name__}: {exc}") from None
    else:
        kit = target
    if not isinstance(kit, OutboxKit):
        raise CommandError(f"{path} is a {type(kit).__name__}, not an OutboxKit (or a function returning one)")
    return kit


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {column: max([len(column)] + [len(str(row.get(column, ""))) for row in rows]) for column in columns}
    print("  ".join(column.upper().ljust(widths[column]) for column in columns))
    for row in rows:
        print("  ".join(str(row.get(column, "")).ljust(widths[column]) for column in columns))


def admin_service(kit: OutboxKit) -> AdminService:
    try:
        from outboxkit.admin.service import AdminService
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    source = kit.scheduler  # the registry is the same in every process
    return AdminService(kit, job_source=source)


def actor() -> str:
    """Who acted, for the reset audit: ``cli:<user>@<host>``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"


def age(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = max(0, int((datetime.now(timezone.utc) - moment).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def emit(args: argparse.Namespace, payload: Any, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        print_table(rows, columns)


def command_status(kit: OutboxKit, args: argparse.Namespace) -> int:
    overview = admin_service(kit).overview()
    rows = []
    for outbox in overview.outboxes:
        counts = outbox.counts
        last = outbox.last_drain
        rows.append({
            "outbox": outbox.name,
            "pending": counts.pending,
            "in_flight": counts.in_flight,
            "stuck": counts.stuck,
            "done": f"~{counts.done}" if counts.done_estimated else counts.done,
            "oldest_due": age(outbox.oldest_due_at),
            "last_drain": f"{age(last.started_at)} {last.outcome}" if last else "never",
        })
    emit(args, overview.model_dump(mode="json"), rows,
         ["outbox", "pending", "in_flight", "stuck", "done", "oldest_due", "last_drain"])
    if not args.json:
        leader = overview.leader
        print(f"leader: {leader.host} pid {leader.pid} (since {age(leader.since)})" if leader else "leader: none")
        if len(overview.leaders) > 1:
            print(f"WARNING: {len(overview.leaders)} sessions hold the leader lock", file=sys.stderr)
    return 0


def row_filter(args: argparse.Namespace) -> Any:
    from outboxkit.queries import RowFilter

    return RowFilter(error_contains=args.error_contains, status_code=args.status_code)


def command_stuck(kit: OutboxKit, args: argparse.Namespace) -> int:
    service = admin_service(kit)
    page = service.rows(args.outbox, status="stuck", row_filter=row_filter(args), cursor=args.cursor, limit=args.limit)
    rows = [
        {"id": row.id, "attempts": row.attempts, "status_code": row.last_status_code or "-",
         "updated": age(row.updated_at), "last_error": (row.last_error or "").replace("\n", " ")[:100]}
        for row in page.rows
    ]
    emit(args, page.model_dump(mode="json"), rows, ["id", "attempts", "status_code", "updated", "last_error"])
    if not args.json and page.next_cursor:
        print(f"more: --cursor {page.next_cursor}")
    return 0


def command_reset(kit: OutboxKit, args: argparse.Namespace) -> int:
    from outboxkit.admin.service import RowsHeld, RowsNotFound

    service = admin_service(kit)
    if args.all == bool(args.ids):
        raise CommandError("name row ids, or pass --all (with optional filters) to reset every matching stuck row")
    if args.ids:
        try:
            result = service.retry_now(args.outbox, args.ids, actor=actor()) if args.retry_now else \
                service.reset(args.outbox, args.ids, actor=actor())
        except (RowsHeld, RowsNotFound) as exc:
            raise CommandError(str(exc)) from None
        rows = [{"id": row_id, "result": "changed"} for row_id in result.changed_ids]
        rows += [{"id": skipped.id, "result": f"skipped: {skipped.reason}"} for skipped in result.skipped]
        emit(args, result.model_dump(mode="json"), rows, ["id", "result"])
        return 0
    filters = row_filter(args)
    preview = service.reset_matching(args.outbox, filters, dry_run=True, actor=actor())
    if args.dry_run:
        emit(args, preview.model_dump(mode="json"), [{"matched": preview.matched,
             "sample_ids": " ".join(map(str, preview.sample_ids))}], ["matched", "sample_ids"])
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise CommandError(f"{preview.matched} stuck row(s) match; pass --yes to reset them without a prompt")
        answer = input(f"reset {preview.matched} stuck row(s) of {args.outbox}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
    outcome = service.reset_matching(args.outbox, filters, dry_run=False, actor=actor())
    emit(args, outcome.model_dump(mode="json"), [{"matched": outcome.matched, "reset": outcome.changed,
         "audit_id": outcome.audit_id}], ["matched", "reset", "audit_id"])
    return 0


def command_jobs(kit: OutboxKit, args: argparse.Namespace) -> int:
    view = admin_service(kit).jobs()
    rows = [
        {"id": job.id, "name": job.name, "trigger": job.trigger or "-",
         "next_run": job.next_run_at.isoformat(timespec="seconds") if job.next_run_at else "-",
         "last_run": f"{age(job.last_run.started_at)} {job.last_run.outcome}" if job.last_run else "never"}
        for job in view.jobs
    ]
    emit(args, view.model_dump(mode="json"), rows, ["id", "name", "trigger", "next_run", "last_run"])
    if not args.json:
        print(f"leader: {view.leader.host} pid {view.leader.pid}" if view.leader else "leader: none")
    return 0


def command_drain(kit: OutboxKit, args: argparse.Namespace) -> int:
    names = [args.outbox] if args.outbox else [outbox.__outbox__.job_name for outbox in kit.outboxes]
    results = []
    for name in names:
        drainer = kit.drainer(name)
        result = drainer.drain_once() if args.once else drainer.drain()
        results.append({"outbox": name, **result.as_counts(), "error": result.error or ""})
    if args.json:
        print(json.dumps(results))
    else:
        print_table(results, ["outbox", "claimed", "delivered", "retried", "stuck", "error"])
    return 1 if any(result["error"] for result in results) else 0


def command_worker(kit: OutboxKit, args: argparse.Namespace) -> int:
    """Drain in the foreground until SIGTERM or SIGINT: LISTEN, claim on wake-up and at due times."""
    import logging

    from outboxkit.metrics import serve_worker_metrics
    from outboxkit.worker import DrainWorker

    if not logging.getLogger().handlers:  # the application did not configure logging: say what happens
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    worker = DrainWorker(kit, outboxes=args.outboxes or None)
    if args.scheduler:
        kit.scheduler.elect()  # campaign too: this process may lead and run the schedule
    with serve_worker_metrics(kit, port=args.metrics_port, host=args.metrics_host):  # no-op without --metrics-port
        worker.run_until_stopped()
    return 0


def command_demo(argv: list[str]) -> int:
    """Run the example service from a clone of the repository."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "admin" / "exampleapp" / "demo.py").is_file():
            sys.path.insert(0, str(folder / "admin"))
            sys.path.insert(1, str(folder))
            from exampleapp.demo import main as demo_main  # the example service, not part of the library

            return int(demo_main(argv))
    raise CommandError(
        "the demo runs the example service from a clone of the outboxkit repository; "
        "run `outboxkit demo` inside the clone (admin/exampleapp must exist)"
    )


def row_id(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a row id") from None
    if not 1 <= number < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is not a row id (1 to 2^63-1)")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outboxkit", description="Operate outboxkit outboxes from a shell.")
    parser.add_argument("--app", default=os.environ.get("OUTBOXKIT_APP"),
                        help="import path of the application's kit, e.g. myapp.outbox:kit (default: $OUTBOXKIT_APP)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("demo", help="run the example service end to end (from a clone)", add_help=False)
    commands.add_parser("status", help="per outbox: counts, oldest due, last drain; and the leader")
    stuck = commands.add_parser("stuck", help="list the stuck rows of one outbox")
    stuck.add_argument("outbox", help="the outbox's job name")
    reset = commands.add_parser("reset", help="reset stuck rows (or retry pending rows in backoff now)")
    reset.add_argument("outbox", help="the outbox's job name")
    reset.add_argument("ids", nargs="*", type=row_id, help="row ids")
    reset.add_argument("--all", action="store_true", help="every stuck row matching the filters")
    reset.add_argument("--dry-run", action="store_true", help="with --all: count and sample, change nothing")
    reset.add_argument("--yes", action="store_true", help="with --all: do not ask for confirmation")
    reset.add_argument("--retry-now", action="store_true", help="with ids: make pending rows in backoff due now")
    for command in (stuck, reset):
        command.add_argument("--error-contains", help="only rows whose last error contains this text")
        command.add_argument("--status-code", type=int, help="only rows whose last HTTP status is this")
    stuck.add_argument("--limit", type=int, default=50, choices=range(1, 201), metavar="1..200")
    stuck.add_argument("--cursor", help="continue after a previous page")
    commands.add_parser("jobs", help="scheduled jobs with their last run, and the leader")
    drain = commands.add_parser("drain", help="deliver due rows now")
    drain.add_argument("--once", action="store_true", help="one batch per outbox instead of until empty")
    drain.add_argument("--outbox", help="only this outbox (its job name)")
    worker = commands.add_parser(
        "worker", help="drain in the foreground until SIGTERM/SIGINT (a dedicated drainer process)"
    )
    worker.add_argument("--outbox", dest="outboxes", action="append", metavar="NAME",
                        help="only this outbox (repeat for several; default: every outbox of the kit)")
    worker.add_argument("--scheduler", action="store_true",
                        help="also campaign for leadership and run the schedule when elected")
    worker.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port (needs the metrics extra)")
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        try:
            return command_demo(argv[1:])
        except CommandError as exc:
            print(f"outboxkit: {exc}", file=sys.stderr)
            return 1
    args = build_parser().parse_args(argv)
    commands = {"status": command_status, "stuck": command_stuck, "reset": command_reset,
                "jobs": command_jobs, "drain": command_drain, "worker": command_worker}
    try:
        kit = load_kit(args.app)
        try:
            for name in [getattr(args, "outbox", None), *(getattr(args, "outboxes", None) or [])]:
                if name:
                    kit.outbox(name)  # an unknown name fails here, with the known ones listed
            return commands[args.command](kit, args)
        finally:
            kit.close()
    except (CommandError, ConfigurationError, OutboxKitError) as exc:
        print(f"outboxkit: {exc}", file=sys.stderr)
        return 1
    except ProgrammingError as exc:
        if "UndefinedTable" in type(exc.orig).__name__:
            print(f"outboxkit: a table is missing ({str(exc.orig).splitlines()[0]}): {MIGRATION_HINT}", file=sys.stderr)
            return 1
        raise
    except OperationalError as exc:
        print(f"outboxkit: cannot reach the database: {str(exc.orig).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    except DBAPIError as exc:
        print(f"outboxkit: database error: {str(exc.orig).strip().splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
