"""Finding the application's kit and operating on it: every expected failure becomes one line on stderr and exit 1."""

from __future__ import annotations

import getpass
import importlib
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from outboxkit.cli.output import Output, fail
from outboxkit.errors import OutboxKitError, first_line
from outboxkit.kit import OutboxKit
from outboxkit.storage.diagnostics import MIGRATION_HINT

if TYPE_CHECKING:
    from outboxkit.operations.service import OperationsService

__all__ = ["CommandError", "GlobalOptions", "actor", "admin_service", "first_line", "load_kit", "operating"]


class CommandError(Exception):
    """A failure to report in one line, with exit code 1."""


@dataclass
class GlobalOptions:
    app_path: str | None
    json: bool


def load_kit(path: str | None) -> OutboxKit:
    """The kit that ``--app module:attribute`` names (an ``OutboxKit`` or a function returning one)."""
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


def admin_service(kit: OutboxKit) -> OperationsService:
    from outboxkit.operations.service import OperationsService

    return OperationsService(kit, job_source=kit.scheduler)  # the registry is the same in every process


def actor() -> str:
    """Who acted, for the reset audit: ``cli:<user>@<host>``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        user = str(os.getuid())
    return f"cli:{user}@{socket.gethostname()}"


@contextmanager
def operating(context: typer.Context, json_flag: bool, outboxes: Sequence[str] = ()) -> Iterator[tuple[OutboxKit, Output]]:
    """The application's kit (closed afterwards) and the output; every expected failure becomes one line, exit 1."""
    options = context.find_object(GlobalOptions) or GlobalOptions(app_path=None, json=False)
    output = Output(json=options.json or json_flag)
    try:
        kit = load_kit(options.app_path)
        try:
            for name in outboxes:
                kit.outbox(name)  # an unknown name fails here, with the known ones listed
            yield kit, output
        finally:
            kit.close()
    except (CommandError, OutboxKitError) as exc:
        fail(str(exc))
    except ProgrammingError as exc:
        if "UndefinedTable" not in type(exc.orig).__name__:
            raise
        fail(f"a table is missing ({first_line(exc.orig)}): {MIGRATION_HINT}")
    except OperationalError as exc:
        fail(f"cannot reach the database: {first_line(exc.orig)}")
    except DBAPIError as exc:
        fail(f"database error: {first_line(exc.orig)}")

