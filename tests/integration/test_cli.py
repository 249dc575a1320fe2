"""The operator CLI, run in-process against a real database (the example's kit)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from exampleapp.models import WebhookOutbox
from sqlalchemy import select

from outboxkit.cli import main
from outboxkit.storage.notify import channel_for
from outboxkit.storage.tables import reset_audit
from tests.support.admin import add_webhooks, listening, notified
from tests.support.cli import cli_fixture
from tests.support.database import sqlalchemy_url

APP = ["--app", "exampleapp.app:kit_from_environment"]


cli = cli_fixture(APP)


def statuses(engine) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(select(WebhookOutbox.id, WebhookOutbox.status)).all())


def test_status_shows_counts_per_outbox_as_a_table_and_as_json(cli, engine):
    add_webhooks(engine, 3, status="stuck")
    code, out, _ = cli("status")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("webhooks"))
    assert line.split()[:4] == ["webhooks", "0", "0", "3"]
    assert "leader: none" in out
    code, out, _ = cli("--json", "status")
    overview = json.loads(out)
    assert {outbox["name"]: outbox["counts"]["stuck"] for outbox in overview["outboxes"]} == {"credit-grants": 0, "webhooks": 3}


def test_stuck_lists_rows_and_filters_by_error_text(cli, engine):
    (timeout_id,) = add_webhooks(engine, 1, error="timeout: ReadTimeout", status_code=None)
    add_webhooks(engine, 2, error="HTTP 400: bad amount")
    code, out, _ = cli("--json", "stuck", "webhooks", "--error-contains", "timeout")
    assert code == 0
    assert [row["id"] for row in json.loads(out)["rows"]] == [timeout_id]


def test_reset_by_ids_moves_stuck_rows_to_pending_and_is_audited(cli, engine):
    ids = add_webhooks(engine, 2)
    code, out, _ = cli("reset", "webhooks", *map(str, ids))
    assert code == 0, out
    assert set(statuses(engine).values()) == {"pending"}
    with engine.connect() as connection:
        audit = connection.execute(select(reset_audit)).mappings().one()
    assert audit["actor"].startswith("cli:") and audit["row_count"] == 2 and sorted(audit["row_ids"]) == sorted(ids)


def test_reset_all_dry_run_counts_and_changes_nothing(cli, engine):
    add_webhooks(engine, 4)
    code, out, _ = cli("--json", "reset", "webhooks", "--all", "--dry-run")
    assert code == 0 and json.loads(out)["matched"] == 4
    assert set(statuses(engine).values()) == {"stuck"}


def test_reset_all_without_a_terminal_needs_yes_and_then_resets_matching_rows(cli, engine):
    add_webhooks(engine, 2, status_code=422, error="HTTP 422")
    (other,) = add_webhooks(engine, 1, status_code=400)
    code, _, err = cli("reset", "webhooks", "--all", "--status-code", "422")
    assert code == 1 and "--yes" in err
    assert set(statuses(engine).values()) == {"stuck"}
    code, out, _ = cli("--json", "reset", "webhooks", "--all", "--status-code", "422", "--yes")
    assert code == 0 and json.loads(out)["changed"] == 2
    assert statuses(engine)[other] == "stuck"


def test_a_held_row_is_refused_and_left_alone(cli, engine, clock):
    from datetime import datetime, timedelta, timezone

    (row_id,) = add_webhooks(engine, 1, status="pending", claimed_until=datetime.now(timezone.utc) + timedelta(minutes=5))
    code, _, err = cli("reset", "webhooks", str(row_id))
    assert code == 1 and str(row_id) in err
    assert statuses(engine)[row_id] == "pending"


def test_unknown_outbox_names_the_registered_ones(cli):
    code, _, err = cli("stuck", "nope")
    assert code == 1 and "no outbox named 'nope'" in err and "webhooks" in err


@pytest.mark.parametrize("word", ["abc", "0", "-1", "9223372036854775808", "١٢", "1_000", "+5", " 7"])
def test_bad_row_ids_are_a_usage_error_and_change_nothing(cli, engine, word):
    (row_id,) = add_webhooks(engine, 1)
    code, out, err = cli("reset", "webhooks", str(row_id), word)
    assert code == 2 and out == ""
    assert ("No such option" if word.startswith("-") else "is not a row id") in err
    assert statuses(engine)[row_id] == "stuck"


def test_a_missing_table_says_which_migration_to_run(database_factory, monkeypatch, capsys):
    url = database_factory.create_empty()
    try:
        monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(url))
        assert main([*APP, "status"]) == 1
        err = capsys.readouterr().err
        assert "a table is missing" in err and "alembic upgrade heads" in err
    finally:
        database_factory.drop(url)


def test_drain_once_delivers_due_rows(cli, engine, receiver):
    add_webhooks(engine, 3, status="pending", attempts=0, target_url=receiver.url + "/hook")
    code, out, _ = cli("--json", "drain", "--once", "--outbox", "webhooks")
    assert code == 0
    assert json.loads(out) == [{"outbox": "webhooks", "claimed": 3, "delivered": 3, "retried": 0, "stuck": 0,
                                "lost_claims": 0, "error": ""}]
    assert set(statuses(engine).values()) == {"done"}


def test_a_cli_reset_wakes_a_listening_drainer(cli, engine, database_url):
    (row_id,) = add_webhooks(engine, 1)
    add_webhooks(engine, 1, status_code=422)
    with listening(database_url, WebhookOutbox) as listener:
        code, _, _ = cli("reset", "webhooks", str(row_id))
        assert code == 0
        assert notified(listener) == [channel_for(WebhookOutbox)]
        code, _, _ = cli("reset", "webhooks", "--all", "--status-code", "422", "--yes")
        assert code == 0
        assert notified(listener) == [channel_for(WebhookOutbox)]


def test_status_and_stuck_need_no_web_framework(database_url, engine):
    # The CLI acts through outboxkit.operations; an environment without FastAPI and Jinja2 still runs it.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys\n"
        "for name in ('fastapi', 'jinja2', 'starlette'):\n"
        "    sys.modules[name] = None  # an import of it now fails\n"
        "from outboxkit.cli import main\n"
        "code = main(['--app', 'tests.support.worker_app:kit_from_environment', 'status'])\n"
        "code = code or main(['--app', 'tests.support.worker_app:kit_from_environment', 'stuck', 'sample-events'])\n"
        "assert 'fastapi' not in sys.modules or sys.modules['fastapi'] is None\n"
        "assert 'outboxkit.admin' not in sys.modules, 'the CLI imported the admin'\n"
        "raise SystemExit(code)\n"
    )
    environment = {**os.environ, "DATABASE_URL": database_url,
                   "PYTHONPATH": os.pathsep.join([str(root), str(root / "admin")])}
    finished = subprocess.run([sys.executable, "-c", script], env=environment, cwd=root,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "sample-events" in finished.stdout


def test_json_after_the_command_is_the_same_as_before_it(cli, engine):
    add_webhooks(engine, 2, status="stuck")
    for command in (["status"], ["jobs"], ["stuck", "webhooks"], ["reset", "webhooks", "--all", "--dry-run"]):
        before = cli("--json", *command)
        after = cli(*command, "--json")
        assert before[0] == after[0] == 0, (command, before, after)
        before_document, after_document = json.loads(before[1]), json.loads(after[1])
        if isinstance(before_document, dict):
            before_document.pop("generated_at", None), after_document.pop("generated_at", None)
        assert after_document == before_document, command


BOX_DRAWING = re.compile("[\u2500-\u257f]")


def test_piped_output_is_plain_text_one_line_per_row(cli, engine):
    long_error = "HTTP 400: " + "the receiver said no, " * 8  # longer than an 80-column terminal
    (row_id,) = add_webhooks(engine, 1, error=long_error)
    code, out, _ = cli("stuck", "webhooks")
    assert code == 0
    assert "\x1b" not in out and not BOX_DRAWING.search(out)  # no escape codes, no box drawing
    header, row = out.splitlines()
    assert header.split() == ["ID", "ATTEMPTS", "STATUS_CODE", "UPDATED", "LAST_ERROR"]
    assert row.split()[0] == str(row_id) and long_error[:100].strip() in row  # not wrapped, not truncated


def run_on_a_terminal(words: list[str], environment: dict[str, str], answer: bytes | None = None) -> tuple[int, str]:
    """The CLI in a subprocess whose stdin and stdout are a pseudo-terminal: its exit code and what it wrote there."""
    import os
    import pty
    import subprocess
    import sys

    controller, terminal = pty.openpty()
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen([sys.executable, "-m", "outboxkit.cli", *APP, *words], stdin=terminal, stdout=terminal,
                               stderr=subprocess.PIPE, cwd=root, env=environment)
    os.close(terminal)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
        if answer is not None and b"[y/N]" in b"".join(chunks):
            os.write(controller, answer)
            answer = None
    os.close(controller)
    _, errors = process.communicate(timeout=120)
    assert process.returncode in (0, 1), errors
    return process.returncode, b"".join(chunks).decode()


def terminal_environment(database_url: str) -> dict[str, str]:
    import os

    root = Path(__file__).resolve().parents[2]
    environment = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "FORCE_COLOR")}
    environment.update(DATABASE_URL=sqlalchemy_url(database_url), COLUMNS="160", TERM="xterm-256color",
                       PYTHONPATH=os.pathsep.join([str(root), str(root / "admin")]))
    return environment


def select_graphic_parameters(text: str) -> set[str]:
    return {parameter for group in re.findall(r"\x1b\[([0-9;]*)m", text) for parameter in group.split(";")}


def test_a_terminal_gets_colour_unless_no_color_is_set(database_url, engine):
    add_webhooks(engine, 3, status="stuck")
    environment = terminal_environment(database_url)
    code, coloured = run_on_a_terminal(["status"], environment)
    assert code == 0 and "webhooks" in coloured
    assert "31" in select_graphic_parameters(coloured)  # red: the outbox with stuck rows
    code, plain = run_on_a_terminal(["status"], {**environment, "NO_COLOR": "1"})
    assert code == 0 and "webhooks" in plain
    colours = {parameter for parameter in select_graphic_parameters(plain)
               if parameter[:1] in ("3", "4", "9") and parameter not in ("3", "4")}  # 3x/4x/9x: colours
    assert colours == set(), plain


def test_reset_all_on_a_terminal_asks_first_and_a_no_changes_nothing(database_url, engine):
    add_webhooks(engine, 2)
    environment = terminal_environment(database_url)
    code, out = run_on_a_terminal(["reset", "webhooks", "--all"], environment, answer=b"n\n")
    assert code == 1 and "reset 2 stuck row(s) of webhooks? [y/N]" in out and "nothing changed" in out
    assert set(statuses(engine).values()) == {"stuck"}
    code, out = run_on_a_terminal(["reset", "webhooks", "--all"], environment, answer=b"y\n")
    assert code == 0
    assert set(statuses(engine).values()) == {"pending"}


def test_the_app_can_come_from_the_environment(database_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))
    monkeypatch.setenv("OUTBOXKIT_APP", APP[1])
    assert main(["--json", "status"]) == 0
    assert {outbox["name"] for outbox in json.loads(capsys.readouterr().out)["outboxes"]} == {"credit-grants", "webhooks"}


@pytest.mark.parametrize("words", [
    ["stauts"],                                # an unknown command
    ["status", "--verbose"],                   # an unknown option
    ["stuck"],                                 # a missing argument
    ["stuck", "webhooks", "--limit", "500"],   # out of range
    ["reset", "webhooks"],                     # neither ids nor --all
    ["reset", "webhooks", "1", "--all"],       # both
    ["reset", "webhooks", "--all", "--retry-now", "--yes"],
])
def test_a_usage_error_exits_2_and_changes_nothing(cli, engine, words):
    ids = add_webhooks(engine, 2)
    code, out, err = cli(*words)
    assert code == 2 and out == "" and "Usage: outboxkit" in err
    assert set(statuses(engine).values()) == {"stuck"} and len(ids) == 2


def test_jobs_shows_each_schedule_in_words(cli):
    code, out, _ = cli("jobs")
    assert code == 0, out
    code, document, _ = cli("--json", "jobs")
    jobs = json.loads(document)["jobs"]
    assert jobs, "the example app registers jobs"
    for job in jobs:
        line = next(line for line in out.splitlines() if line.startswith(job["id"]))
        assert job["schedule"] and job["schedule"] in line, (job, line)
    assert "interval[" not in out and "cron[" not in out  # APScheduler's own trigger spelling
