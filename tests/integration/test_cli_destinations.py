"""``outboxkit destinations``, run in-process against a real database (the example's kit): the list, and resume,
disable and probe, audited as the shell's user; an unknown outbox or destination fails with one line, nothing changed."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

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


def test_status_shows_rows_held_by_destinations_and_lists_the_unhealthy_ones_first(cli, engine):
    now = datetime.now(timezone.utc)  # the module's NOW is as old as the run: a slow-down from it may be over
    open_breaker(engine, at=now)
    add_webhooks(engine, 3, status="pending", next_attempt_at=now)
    slowed = "https://partner.example:443"
    record(engine, Signal.THROTTLED, at=now, destination=slowed, status_code=429, slow_down=600)
    add_webhooks(engine, 1, status="pending", next_attempt_at=now, target_url="https://partner.example/in")
    cli("destinations", "disable", DEAD, "--outbox", "webhooks")

    code, out, _ = cli("status")

    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("OUTBOX")).lower().split()
    webhooks = dict(zip(header, next(line for line in out.splitlines() if line.startswith("webhooks")).split(), strict=False))
    assert (webhooks["pending"], webhooks["held_by_dest"], webhooks["held_by_order"]) == ("4", "4", "-")
    held = [line for line in out.splitlines() if "holds" in line]
    assert held[0] == f"webhooks {DEAD}: disabled, holds 3 row(s), until resumed"  # disabled first
    assert re.fullmatch(rf"webhooks {re.escape(slowed)}: slowed, holds 1 row\(s\), until in \d+m", held[1])
    code, out, _ = cli("--json", "status")
    overview = json.loads(out)
    assert [(entry["destination"], entry["state"], entry["waiting_rows"]) for entry in overview["held_back"]] == [
        (DEAD, "disabled", 3), (slowed, "slowed", 1)]


def test_the_list_shows_slowed_until_relative_times_and_marks_a_stale_error(cli, engine):
    now = datetime.now(timezone.utc)  # the module's NOW is as old as the run: a slow-down from it may be over
    slowed = "https://partner.example:443"
    record(engine, Signal.THROTTLED, at=now, destination=slowed, status_code=429, slow_down=600)
    record(engine, Signal.FAILURE, at=now, status_code=503)
    record(engine, Signal.SUCCESS, at=now + timedelta(seconds=1))  # answered well since its last error

    code, out, _ = cli("destinations")

    assert code == 0
    header = out.splitlines()[0].lower().split()
    assert header[-3:] == ["open_since", "next_probe", "slowed_until"]
    partner = next(line for line in out.splitlines() if slowed in line)
    assert re.search(r" in \d+m$", partner.rstrip())  # slowed until, relative like every other time
    dead = next(line for line in out.splitlines() if DEAD in line)
    assert "(stale: succeeded" in dead and "503" in dead
