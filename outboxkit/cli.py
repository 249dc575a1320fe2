"""The ``outboxkit`` command line: what an operator does from a shell.

::

    outboxkit demo                                  # the example service, end to end
    outboxkit --app myapp.outbox:kit drain --once   # drain every outbox once

Commands that act on an application's outboxes find its kit by an import
path (``--app module:attribute`` or ``$OUTBOXKIT_APP``); the attribute is an
``OutboxKit`` or a function returning one.  Output is a table for people,
``--json`` for scripts; the exit code is non-zero on failure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outboxkit.errors import ConfigurationError, OutboxKitError
from outboxkit.kit import OutboxKit

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
    kit = target() if callable(target) and not isinstance(target, OutboxKit) else target
    if not isinstance(kit, OutboxKit):
        raise CommandError(f"{path} is a {type(kit).__name__}, not an OutboxKit (or a function returning one)")
    return kit


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {column: max([len(column)] + [len(str(row.get(column, ""))) for row in rows]) for column in columns}
    print("  ".join(column.upper().ljust(widths[column]) for column in columns))
    for row in rows:
        print("  ".join(str(row.get(column, "")).ljust(widths[column]) for column in columns))


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outboxkit", description="Operate outboxkit outboxes from a shell.")
    parser.add_argument("--app", default=os.environ.get("OUTBOXKIT_APP"),
                        help="import path of the application's kit, e.g. myapp.outbox:kit (default: $OUTBOXKIT_APP)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("demo", help="run the example service end to end (from a clone)", add_help=False)
    drain = commands.add_parser("drain", help="deliver due rows now")
    drain.add_argument("--once", action="store_true", help="one batch per outbox instead of until empty")
    drain.add_argument("--outbox", help="only this outbox (its job name)")
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
    try:
        kit = load_kit(args.app)
        try:
            return {"drain": command_drain}[args.command](kit, args)
        finally:
            kit.close()
    except (CommandError, ConfigurationError, OutboxKitError) as exc:
        print(f"outboxkit: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
