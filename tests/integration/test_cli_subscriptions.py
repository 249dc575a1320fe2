"""``outboxkit subscriptions``, run in-process against a real database: every command, audited as the CLI; a refused
endpoint or secret names the field and writes nothing; secrets are never printed."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.support.cli import cli_fixture
from tests.support.events import secret

APP = ["--app", "tests.support.events:kit_from_environment"]
cli = cli_fixture(APP)


def audit(engine) -> list[str]:
    with engine.connect() as connection:
        actions = connection.execute(text("SELECT action, actor FROM outboxkit_subscription_audit ORDER BY id")).all()
    assert all(actor.startswith("cli:") for _, actor in actions)
    return [action for action, _ in actions]


def test_create_list_show_disable_enable_delete(cli, engine):
    code, out, err = cli("--json", "subscriptions", "create", "--url", "http://127.0.0.1:9/hooks",
                         "--event-type", "invoice.*", "--event-type", "customer.created", "--secret", secret(1),
                         "--tenant", "acme", "--header", "X-Customer: 7")
    assert code == 0, err
    [created] = json.loads(out)
    assert (created["event_types"], created["tenant"], created["secret_count"]) == (["invoice.*", "customer.created"], "acme", 1)
    assert secret(1) not in out
    identifier = str(created["id"])
    code, out, _ = cli("subscriptions", "list", "--tenant", "acme")
    assert code == 0 and "http://127.0.0.1:9/hooks" in out and "invoice.*" in out
    assert cli("subscriptions", "list", "--tenant", "globex")[1].count("127.0.0.1") == 0
    code, out, err = cli("subscriptions", "disable", identifier, "--reason", "the customer asked")
    assert code == 0 and "no (the customer asked)" in out, err
    assert cli("subscriptions", "enable", identifier)[0] == 0
    code, out, _ = cli("subscriptions", "show", identifier)
    assert code == 0 and "disable" in out and "enable" in out
    code, _, err = cli("subscriptions", "delete", identifier)
    assert code == 1 and "add --yes" in err
    assert cli("subscriptions", "delete", identifier, "--yes")[0] == 0
    assert audit(engine) == ["create", "disable", "enable", "delete"]
    code, _, err = cli("subscriptions", "show", identifier)
    assert code == 1 and f"no subscription with id {identifier}" in err


def test_refusals_name_the_field_and_write_nothing(cli, engine):
    code, _, err = cli("subscriptions", "create", "--url", "http://10.1.2.3/hooks", "--event-type", "invoice.paid",
                       "--secret", secret(1))
    assert code == 1 and "url:" in err and "private" in err
    code, _, err = cli("subscriptions", "create", "--url", "http://127.0.0.1:9/hooks", "--event-type", "invoice.paid",
                       "--secret", "whsec_c2hvcnQ=")
    assert code == 1 and "secrets: webhook secret #1" in err and "c2hvcnQ" not in err
    code, _, err = cli("subscriptions", "create", "--url", "http://127.0.0.1:9/hooks", "--event-type", "*",
                       "--secret", secret(1))
    assert code == 1 and "would match every event" in err
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM outboxkit_subscriptions")) == 0
    assert audit(engine) == []


def test_replay_counts_with_dry_run_then_enqueues_audited(cli, engine):
    from sqlalchemy.orm import Session

    from outboxkit import publish

    with Session(engine) as session, session.begin():
        publish(session, "invoice.paid", {"n": 1})
        publish(session, "invoice.paid", {"n": 2}, tenant="acme")  # another tenant's: never replayed here
    code, out, err = cli("--json", "subscriptions", "create", "--url", "http://127.0.0.1:9/late",
                         "--event-type", "invoice.*", "--secret", secret(1))
    assert code == 0, err
    identifier = str(json.loads(out)[0]["id"])
    code, out, err = cli("--json", "subscriptions", "replay", identifier, "--since", "2000-01-01T00:00:00+00:00", "--dry-run")
    assert code == 0, err
    assert json.loads(out) == {"subscription_id": int(identifier), "events": 1, "enqueued": 0, "dry_run": True}
    code, _, err = cli("subscriptions", "replay", identifier, "--since", "2000-01-01")
    assert code != 0 and "offset" in err
    code, out, err = cli("--json", "subscriptions", "replay", identifier, "--since", "2000-01-01T00:00:00Z")
    assert code == 0 and json.loads(out)["enqueued"] == 1, err
    assert audit(engine) == ["create", "replay"]


def test_create_with_limits_shows_them_and_a_bad_one_writes_nothing(cli, engine):
    base = ["subscriptions", "create", "--url", "http://127.0.0.1:9/hooks", "--event-type", "invoice.paid",
            "--secret", secret(1)]
    code, _, err = cli(*base, "--max-in-flight", "0")
    assert code == 1 and "max_in_flight: cap must be from 1 to 10,000 sends in flight" in err
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM outboxkit_subscriptions")) == 0
        assert connection.scalar(text("SELECT count(*) FROM outboxkit_destination_limits")) == 0
    code, out, err = cli("--json", *base, "--rate-limit", "2.5", "--max-in-flight", "1")
    assert code == 0, err
    [created] = json.loads(out)
    assert (created["rate_limit"], created["max_in_flight"]) == (2.5, 1)
    code, out, _ = cli("subscriptions", "show", str(created["id"]))
    assert code == 0 and "2.5/s" in out and "1 in flight" in out
    with engine.connect() as connection:
        assert connection.execute(text("SELECT per_second, cap FROM outboxkit_destination_limits")).all() == [(2.5, 1)]
