"""``outboxkit destinations``, run in-process against a real database (the example's kit): the list, and resume,
disable and probe, audited as the shell's user; an unknown outbox or destination fails with one line, nothing changed."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from outboxkit.breaker import Signal
from outboxkit.cli import main
from outboxkit.storage.tables import reset_audit
from tests.support.admin import add_webhooks, snapshot
from tests.support.database import sqlalchemy_url
from tests.support.destinations import DEAD, destination_row, open_breaker, record

APP = ["--app", "exampleapp.app:kit_from_environment"]
NOW = datetime.now(timezone.utc)  # the example's kit runs on the system clock


@pytest.fixture
def cli(database_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(database_url))

    def run(*words: str) -> tuple[int, str, str]:
        code = main([*APP, *words])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def audit(engine) -> list[dict]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(select(reset_audit).order_by(reset_audit.c.id)).mappings()]


def test_the_list_shows_each_destination_with_its_state_failures_and_rows_waiting(cli, engine):
    open_breaker(engine, at=NOW)
    add_webhooks(engine, 2, status="pending", next_attempt_at=NOW)
    record(engine, Signal.SUCCESS, at=NOW, destination="https://partner.example:443")
    code, out, _ = cli("destinations")
    assert code == 0
    dead = next(line for line in out.splitlines() if DEAD in line).split()
    assert dead[:6] == ["webhooks", DEAD, "open", "100%", "3", "503"] and "2" in dead
    code, out, _ = cli("--json", "destinations", "--outbox", "webhooks")
    (webhooks,) = json.loads(out)
    assert [(entry["name"], entry["status"], entry["waiting_rows"]) for entry in webhooks["destinations"]] == [
        (DEAD, "open", 2), ("https://partner.example:443", "healthy", 0)]
    code, out, _ = cli("destinations", "--outbox", "credit-grants")
    assert code == 0 and "no destination has failed" in out


def test_resume_disable_and_probe_are_audited_as_the_shell_user(cli, engine):
    open_breaker(engine, at=NOW)
    code, out, _ = cli("--json", "destinations", "probe", DEAD, "--outbox", "webhooks")
    assert code == 0 and json.loads(out)["changed"] is True
    code, out, _ = cli("destinations", "disable", DEAD, "--outbox", "webhooks")
    assert code == 0 and "changed" in out and destination_row(engine)["status"] == "disabled"
    code, out, _ = cli("destinations", "disable", DEAD, "--outbox", "webhooks")
    assert code == 0 and "unchanged: it is already disabled" in out
    code, out, _ = cli("--json", "destinations", "resume", DEAD, "--outbox", "webhooks")
    assert code == 0 and json.loads(out)["status"] == "healthy" and destination_row(engine)["status"] == "healthy"
    entries = audit(engine)
    assert [entry["action"] for entry in entries] == ["destination_probe", "destination_disable", "destination_resume"]
    assert all(entry["actor"].startswith("cli:") and entry["filter"]["destination"] == DEAD for entry in entries)


def test_an_unknown_destination_or_outbox_fails_with_one_line_and_changes_nothing(cli, engine):
    open_breaker(engine, at=NOW)
    before = snapshot(engine), destination_row(engine)
    code, out, err = cli("destinations", "resume", "http://nowhere:1", "--outbox", "webhooks")
    assert code == 1 and "has no destination 'http://nowhere:1'" in err and "nothing was changed" in err
    code, _, err = cli("destinations", "disable", DEAD, "--outbox", "nope")
    assert code == 1 and "nope" in err
    code, _, err = cli("destinations", "probe", DEAD)
    assert code == 2  # --outbox is required: a usage error
    assert (snapshot(engine), destination_row(engine)) == before
