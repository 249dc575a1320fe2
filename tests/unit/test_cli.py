"""The operator CLI before it reaches a database: an unreachable URL, a missing app, shell completion.

The commands against a real database are in tests/integration/test_cli.py.
"""

from __future__ import annotations

from pathlib import Path

from outboxkit.cli import main

APP = ["--app", "exampleapp.app:kit_from_environment"]


def test_a_wrong_database_url_says_it_cannot_reach_the_database(monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:9/nothing")
    assert main([*APP, "status"]) == 1
    assert "cannot reach the database" in capsys.readouterr().err


def test_missing_app_is_explained(capsys):
    assert main(["status"]) == 1
    assert "--app" in capsys.readouterr().err


def test_shell_completion_is_installed_through_the_standard_options():
    import os
    import subprocess
    import sys

    assert main(["--help"]) == 0  # the options exist (typer adds them to the top-level command)
    root = Path(__file__).resolve().parents[2]
    # Typer detects the calling shell unless told not to; then the option takes the shell by name, so the
    # test does not depend on the shell that runs the suite (under `sh -c` detection says "sh", unsupported).
    shown = subprocess.run([sys.executable, "-m", "outboxkit.cli", "--show-completion", "bash"], cwd=root,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert shown.returncode == 0 and "_OUTBOXKIT_COMPLETE=complete_bash" in shown.stdout
    # What that script asks the CLI for while one types `outboxkit st<TAB>`:
    completed = subprocess.run([sys.executable, "-m", "outboxkit.cli"], cwd=root, capture_output=True, text=True,
                               env={**os.environ, "_OUTBOXKIT_COMPLETE": "complete_bash",
                                    "COMP_WORDS": "outboxkit st", "COMP_CWORD": "1"}, timeout=60)
    assert completed.stdout.split() == ["status", "stuck"]


def test_app_is_accepted_after_the_command_too(monkeypatch, capsys):
    """``outboxkit worker --app myapp:kit`` reads as ``outboxkit --app myapp:kit worker``."""
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:9/nothing")
    assert main(["status", *APP]) == 1
    assert "cannot reach the database" in capsys.readouterr().err
    assert main(["status", "--app=exampleapp.app:kit_from_environment"]) == 1
    assert "cannot reach the database" in capsys.readouterr().err


def test_only_app_moves_and_nothing_after_a_double_dash():
    from outboxkit.cli import app_option_first

    assert app_option_first(["worker", "--app", "a:b", "--json"]) == ["--app", "a:b", "worker", "--json"]
    assert app_option_first(["demo", "--", "--app", "x"]) == ["demo", "--", "--app", "x"]
    assert app_option_first(["--app", "a:b", "status"]) == ["--app", "a:b", "status"]
