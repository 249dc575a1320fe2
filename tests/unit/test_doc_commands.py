"""Every ``outboxkit``, ``alembic`` and ``pytest`` command the README and docs/ show is checked against the real thing.

A command in a shell block (a line that starts with it) or in inline code (a span that starts with it)
is split as a shell would and handed to the CLI's own parser, down to the last sub-command, without
running it: an unknown command, an option in the wrong place or a bad value fails here, not in a
reader's terminal. Spans that stand for a family of commands (``...``, ``a|b|c``, ``COMMAND``) are
left out; ``<placeholders>`` get a plausible value. A ``pytest`` command's test paths must exist and its
markers must be the project's (the README's test command itself is what CI runs).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer.main

from outboxkit.cli import app, app_option_first

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("outboxkit", ".venv/bin/outboxkit", "alembic", ".venv/bin/python -m pytest", "python -m pytest", "pytest")
FENCE = re.compile(r"```(?:sh|bash|console|shell)?\n(.*?)```", re.S)
SPAN = re.compile(r"`([^`]+)`")


def shown_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.findall(text):
            for line in block.splitlines():
                if line.strip().startswith(tuple(p + " " for p in PROGRAMS)):
                    found.append((page.name, line.strip()))
        paragraphs = (" ".join(paragraph.split()) for paragraph in FENCE.sub("", text).split("\n\n"))
        for span in (span for paragraph in paragraphs for span in SPAN.findall(paragraph)):  # a span may wrap
            if span.startswith(tuple(p + " " for p in PROGRAMS)):
                found.append((page.name, span))
    return sorted(set(found))


def words_of(command: str) -> list[str] | None:
    command = command.split("  #", 1)[0].split(" # ", 1)[0]
    command = re.split(r"\s[|>]\s|\s>\s?|\s\|\s?", command)[0]  # the command, not what its output goes to
    if "..." in command or re.search(r"\w\|\w", command) or "COMMAND" in command:
        return None
    command = re.sub(r"<[^>]*id[^>]*>(\.\.\.)?", "41", command)
    command = re.sub(r"<[^>]+>", "webhooks", command)
    words = shlex.split(command)
    return words[3:] if words[1:3] == ["-m", "pytest"] else words[1:]


EAGER = {"--install-completion", "--show-completion", "--help", "-h"}  # options that act while parsing


def parse_outboxkit(words: list[str]) -> None:
    """Parse ``words`` down through every group to the command, as ``outboxkit`` would, without running it."""
    command: click.Command = typer.main.get_command(app)
    if EAGER & set(words):  # parsing would act (install a completion script, print help): the option must exist
        names = {name for parameter in command.params for name in parameter.opts}
        assert EAGER & set(words) <= names | {"-h"}, f"no such option in {words}"
        return
    context = command.make_context("outboxkit", app_option_first(words), resilient_parsing=False)
    while isinstance(command, click.Group):
        rest = [*context.protected_args, *context.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(context, rest)
        assert sub is not None and name is not None
        command, context = sub, sub.make_context(name, rest, parent=context)


def check_pytest(words: list[str]) -> None:
    import tomllib

    markers = {line.split(":", 1)[0] for line in tomllib.loads((ROOT / "pyproject.toml").read_text())
               ["tool"]["pytest"]["ini_options"]["markers"]}
    for index, word in enumerate(words):
        if word.startswith("tests"):
            assert (ROOT / word.split("::", 1)[0]).exists(), f"no such test path: {word}"
        if index and words[index - 1] == "-m":
            named = set(re.findall(r"[a-z_]+", word)) - {"not", "and", "or"}
            assert named <= markers, f"unknown markers {named - markers}"


def parse_alembic(words: list[str]) -> None:
    from alembic.config import CommandLine

    options = CommandLine().parser.parse_args(words)
    assert hasattr(options, "cmd"), f"no alembic command in {words}"


COMMANDS = shown_commands()


def test_the_docs_show_commands():
    assert len([c for _, c in COMMANDS if c.startswith("outboxkit")]) >= 20


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_a_command_the_docs_show_parses(page: str, command: str) -> None:
    words = words_of(command)
    if words is None:
        pytest.skip("a family of commands, not one")
    try:
        if command.startswith("alembic"):
            parse_alembic(words)
        elif "pytest" in command.split()[:3]:
            check_pytest(words)
        else:
            parse_outboxkit(words)
    except (click.ClickException, SystemExit) as problem:
        message = problem.format_message() if isinstance(problem, click.ClickException) else f"exit {problem.code}"
        pytest.fail(f"{page}: `{command}` does not parse: {message}")
