"""The command line's output: a table for people (coloured on a terminal, plain when piped), JSON for scripts.

rich is imported where something is printed, not at import: ``outboxkit worker`` loads this package and never
prints a table, and rich (with pygments) would cost its drainer start-up time and memory.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Output", "age", "cell_style", "fail", "make_console"]


def make_console(*, stderr: bool = False) -> Console:
    """A console that colours only a terminal (rich itself honours ``NO_COLOR``) and never wraps piped text."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty()
    # markup and emoji off: an error text such as "[Errno 111]" or ":smile:" is data, printed as it is.
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, width=1_000_000 if piped else None)


def fail(message: str) -> NoReturn:
    """Say one line on stderr and exit 1."""
    from rich.text import Text

    make_console(stderr=True).print(Text("outboxkit: ", style="bold red") + Text(message), soft_wrap=True)
    raise typer.Exit(1)


def age(moment: datetime | None) -> str:
    """A moment as people read it in a table, past or future alike: ``5m ago``, ``in 30s``, or ``-``."""
    if moment is None:
        return "-"
    delta = int((datetime.now(timezone.utc) - moment).total_seconds())
    seconds = abs(delta)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            amount = f"{seconds // size}{unit}"
            return f"in {amount}" if delta < 0 else f"{amount} ago"
    raise AssertionError("unreachable")


def cell_style(column: str, value: Any) -> str:
    """The colour of a cell on a terminal: trouble in red, doubt in yellow, nothing to see dimmed."""
    text = str(value)
    if text in ("-", "never", ""):
        return "dim"
    if column == "stuck" and text != "0" or column == "error" or text.endswith(" error"):
        return "bold red"
    if column == "result":
        return "green" if text == "changed" else "yellow"
    if text.endswith(" abandoned"):  # a run whose scheduler died mid-run
        return "yellow"
    if column == "delivered" and text != "0" or text.endswith(" ok"):
        return "green"
    return ""


@dataclass
class Output:
    """Where a command's answer goes: a table for people, or one JSON document for scripts."""

    json: bool

    @functools.cached_property
    def console(self) -> Console:
        return make_console()

    def emit(self, payload: Any, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
        if self.json:
            print(json.dumps(payload, default=str))
        else:
            self.table(rows, columns)

    def table(self, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        terminal = self.console.is_terminal
        table = Table(box=box.SIMPLE_HEAD if terminal else None, pad_edge=False, show_edge=False,
                      header_style="bold" if terminal else "")
        for column in columns:
            table.add_column(column.upper(), overflow="fold")
        for row in rows:
            table.add_row(*(Text(str(row.get(column, "")), style=cell_style(column, row.get(column, "")))
                            for column in columns))
        self.console.print(table)

    def say(self, message: str, style: str = "") -> None:
        """A line for people, after the table (never in ``--json`` output)."""
        if not self.json:
            from rich.text import Text

            self.console.print(Text(message, style=style), soft_wrap=True)

    def warn(self, message: str) -> None:
        from rich.text import Text

        make_console(stderr=True).print(Text(message, style="bold yellow"), soft_wrap=True)
