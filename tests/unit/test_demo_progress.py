"""The demo's seeding progress: redrawn in place on a terminal, plain lines anywhere else."""

from __future__ import annotations

import io

import pytest
from exampleapp.demo import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_into_a_pipe_prints_plain_lines_at_each_quarter_and_no_carriage_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    output = io.StringIO()
    monkeypatch.setattr("sys.stdout", output)
    for done in range(1, 101):
        progress_bar(done, 100)
    text = output.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [f"[demo] seeding grants {done}/100" for done in (25, 50, 75, 100)]


def test_progress_on_a_terminal_redraws_one_line_and_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    output = Terminal()
    monkeypatch.setattr("sys.stdout", output)
    for done in range(1, 4):
        progress_bar(done, 3)
    text = output.getvalue()
    assert text.count("\r") == 3
    assert text.endswith("|###" + "#" * 27 + "|\n")
