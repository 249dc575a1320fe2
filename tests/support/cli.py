"""The ``cli`` fixture of the command-line tests: ``outboxkit`` run in-process on the test's database."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from outboxkit.cli import main
from tests.support.database import sqlalchemy_url

Run = Callable[..., tuple[int, str, str]]


def cli_fixture(app: list[str]) -> Callable[..., Run]:
    """A fixture ``cli(*words) -> (exit code, stdout, stderr)`` that loads the kit ``app`` names (``--app ...``)."""

    @pytest.fixture
    def cli(database_url, monkeypatch, capsys) -> Run:
        monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))

        def run(*words: str) -> tuple[int, str, str]:
            code = main([*app, *words])
            captured = capsys.readouterr()
            return code, captured.out, captured.err

        return run

    return cli
