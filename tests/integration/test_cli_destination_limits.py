"""``outboxkit destinations limit``, run in-process against a real database (the example's kit): show, set one
limit or both, back to the outbox's own, audited as the shell's user; bad values and unknown names fail with one line,
exit code 1, and change nothing."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.integration.test_cli_destinations import APP, NOW, audit, cli  # noqa: F401  (APP, cli: the fixture)
from tests.support.admin import add_webhooks
from tests.support.destinations import DEAD


def stored(engine) -> list[tuple]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(
            "SELECT outbox, destination, per_second, cap FROM outboxkit_destination_limits ORDER BY destination"))]


def test_limit_shows_sets_each_limit_alone_and_goes_back_to_the_outboxs_own(cli, engine):
    add_webhooks(engine, 2, status="pending", next_attempt_at=NOW)  # the destination is known by its pending rows
    code, out, _ = cli("destinations", "limit", DEAD, "--outbox", "webhooks")
    assert code == 0 and "outbox's own (none)" in out and "outbox's own (8 while failing)" in out
    code, out, _ = cli("--json", "destinations", "limit", DEAD, "--outbox", "webhooks", "--rate", "2.5")
    result = json.loads(out)
    assert code == 0 and result["changed"] is True and (result["limits"]["per_second"], result["limits"]["cap"]) == (2.5, None)
    code, out, _ = cli("destinations", "limit", DEAD, "--outbox", "webhooks", "--cap", "3")  # the rate stays
    assert code == 0 and "2.5/s" in out and "changed" in out
    assert stored(engine) == [("webhooks", DEAD, 2.5, 3)]
    code, out, _ = cli("destinations", "limit", DEAD, "--outbox", "webhooks", "--cap", "3")
    assert code == 0 and "unchanged: its limits are these already" in out
    code, out, _ = cli("destinations", "limit", DEAD, "--outbox", "webhooks", "--rate", "default")
    assert code == 0 and stored(engine) == [("webhooks", DEAD, None, 3)]
    code, out, _ = cli("destinations", "limit", DEAD, "--outbox", "webhooks", "--clear")
    assert code == 0 and stored(engine) == []
    entries = audit(engine)
    assert [entry["action"] for entry in entries] == [
        "destination_limit", "destination_limit", "destination_limit", "destination_limit_clear"]
    assert all(entry["actor"].startswith("cli:") and entry["filter"]["destination"] == DEAD for entry in entries)
    assert entries[-1]["filter"] == {"destination": DEAD, "per_second_before": None, "cap_before": 3,
                                     "per_second_after": None, "cap_after": None}


def test_bad_values_and_unknown_names_fail_with_one_line_and_change_nothing(cli, engine):
    add_webhooks(engine, 1, status="pending", next_attempt_at=NOW)
    for words, message in [
        (["--rate", "fast"], "--rate must be a number, or blank or 'default'"),
        (["--rate", "0"], "rate limit must be more than 0"),
        (["--rate", "-3"], "rate limit must be more than 0"),
        (["--rate", "inf"], "rate limit must be a number of requests per second"),
        (["--cap", "0"], "cap must be from 1 to 10,000"),
        (["--cap", "2.5"], "--cap must be a whole number, or blank or 'default'"),
        (["--cap", "-1"], "cap must be from 1 to 10,000"),
        (["--clear", "--cap", "2"], "--clear resets both limits"),
    ]:
        code, _, err = cli("destinations", "limit", DEAD, "--outbox", "webhooks", *words)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, (words, err)
    code, _, err = cli("destinations", "limit", "https://nowhere.example:443", "--outbox", "webhooks", "--rate", "1")
    assert code == 1 and "has no destination 'https://nowhere.example:443'" in err and "nothing was changed" in err
    code, _, err = cli("destinations", "limit", DEAD, "--outbox", "nope", "--rate", "1")
    assert code == 1 and "nope" in err
    assert stored(engine) == [] and audit(engine) == []
