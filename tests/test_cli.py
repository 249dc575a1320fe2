"""The operator CLI, run in-process against a real database (the example's kit)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from exampleapp.models import WebhookOutbox
from outboxkit.cli import main
from outboxkit.notify import channel_for
from outboxkit.tables import reset_audit
from tests.support.admin import add_webhooks, listening, notified
from tests.support.database import sqlalchemy_url

APP = ["--app", "exampleapp.app:kit_from_environment"]


@pytest.fixture
def cli(database_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))

    def run(*words: str) -> tuple[int, str, str]:
        code = main([*APP, *words])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


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


def test_bad_row_ids_are_a_usage_error(cli):
    with pytest.raises(SystemExit) as exit_info:
        cli("reset", "webhooks", "abc")
    assert exit_info.value.code == 2


def test_a_wrong_database_url_says_it_cannot_reach_the_database(monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://root@127.0.0.1:9/nothing")
    assert main([*APP, "status"]) == 1
    assert "cannot reach the database" in capsys.readouterr().err


def test_a_missing_table_says_which_migration_to_run(database_factory, monkeypatch, capsys):
    url = database_factory.create_empty()
    try:
        monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(url))
        assert main([*APP, "status"]) == 1
        err = capsys.readouterr().err
        assert "a table is missing" in err and "alembic upgrade heads" in err
    finally:
        database_factory.drop(url)


def test_missing_app_is_explained(capsys):
    assert main(["status"]) == 1
    assert "--app" in capsys.readouterr().err


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

    root = Path(__file__).resolve().parent.parent
    script = (
        "import sys\n"
        "for name in ('fastapi', 'jinja2', 'starlette'):\n"
        "    sys.modules[name] = None  # an import of it now fails\n"
        "from outboxkit.cli import main\n"
        "code = main(['--app', 'tests.support.worker_app:kit_from_environment', 'status'])\n"
        "code = code or main(['--app', 'tests.support.worker_app:kit_from_environment', 'stuck', 'sample-events'])\n"
        "assert 'fastapi' not in sys.modules or sys.modules['fastapi'] is None\n"
        "raise SystemExit(code)\n"
    )
    environment = {**os.environ, "DATABASE_URL": database_url,
                   "PYTHONPATH": os.pathsep.join([str(root), str(root / "admin")])}
    finished = subprocess.run([sys.executable, "-c", script], env=environment, cwd=root,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "sample-events" in finished.stdout
