"""``outboxkit schedules``, run in-process against a real database: every command, refusals naming the field."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from tests.support.cli import cli_fixture

APP = ["--app", "tests.support.schedule_admin:kit_from_environment"]
EVERY_FIVE = ["--trigger", "every", "--field", "minutes=5"]
CALL = [
    "--url", "http://127.0.0.1:9/heartbeat", "--outbox", "scheduled-calls", "--header", "X-Source: shop",
    "--body", '{"alive": true}',
]
HEARTBEAT = [*EVERY_FIVE, *CALL]


cli = cli_fixture(APP)


def schedule_rows(engine) -> list[tuple[object, ...]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            text("SELECT name, trigger_kind, trigger_fields, enabled, http_headers, http_body FROM outboxkit_schedules")
        )]


def audit(engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return [(row[0], row[1]) for row in connection.execute(
            text("SELECT action, actor FROM outboxkit_schedule_audit ORDER BY id")
        )]


def test_create_from_flags_list_show_and_every_action_audited_as_the_cli(cli, engine):
    code, out, err = cli("schedules", "create", "partner.heartbeat", *HEARTBEAT)
    assert code == 0, err
    assert schedule_rows(engine) == [
        ("partner.heartbeat", "every", {"minutes": 5}, True, {"X-Source": "shop"}, {"alive": True}),
    ]
    code, out, _ = cli("--json", "schedules", "list", "--tz", "Asia/Tokyo")
    (listed,) = json.loads(out)["schedules"]
    assert listed["name"] == "partner.heartbeat" and len(listed["next_fire_times"]) == 5
    assert listed["next_fire_times"][0]["viewer"].endswith("+09:00")
    code, out, _ = cli("schedules", "list")
    assert code == 0 and "partner.heartbeat" in out and "POST http://127.0.0.1:9/heartbeat" in out

    assert cli("schedules", "edit", "partner.heartbeat", "--field", "minutes=10", "--disabled")[0] == 0
    assert schedule_rows(engine)[0][2:4] == ({"minutes": 10}, False)
    assert schedule_rows(engine)[0][4] == {"X-Source": "shop"}  # what the flags did not name stays
    assert cli("schedules", "enable", "partner.heartbeat")[0] == 0
    assert cli("schedules", "disable", "partner.heartbeat")[0] == 0
    code, out, _ = cli("--json", "schedules", "run-now", "partner.heartbeat")
    assert code == 0 and json.loads(out)["schedule"]["definition"]["enabled"] is False  # run now leaves it disabled

    code, out, _ = cli("--json", "schedules", "show", "partner.heartbeat")
    shown = json.loads(out)
    assert shown["schedule"]["definition"]["trigger"]["fields"] == {"minutes": 10}
    assert [entry["action"] for entry in shown["changes"]] == ["run_now", "disable", "enable", "edit", "create"]
    assert cli("schedules", "show", "partner.heartbeat")[0] == 0

    code, _, err = cli("schedules", "delete", "partner.heartbeat")
    assert code == 2 and "--yes" in err and schedule_rows(engine) != []
    assert cli("schedules", "delete", "partner.heartbeat", "--yes")[0] == 0
    assert schedule_rows(engine) == []
    trail = audit(engine)
    assert [action for action, _ in trail] == ["create", "edit", "enable", "disable", "run_now", "delete"]
    assert all(who.startswith("cli:") for _, who in trail)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--timezone", "Mars/Olympus", "--trigger", "cron", "--field", "hour=3", *CALL], "trigger.timezone: unknown IANA"),
        (["--trigger", "cron", "--field", "minute=99", *CALL], "trigger.fields.minute"),
        (["--trigger", "every", "--field", "minutes=0", *CALL], "trigger.fields.minutes"),
        ([*EVERY_FIVE, "--url", "ftp://127.0.0.1/x", "--outbox", "scheduled-calls"], "target.url"),
        ([*EVERY_FIVE, "--job", "unknown-job"], "target.job: no job 'unknown-job' is registered"),
        ([*HEARTBEAT, "--max-running", "0"], "max_running"),
        (["--trigger", "every", "--field", "seconds=1000000000000000000", *CALL], "trigger.fields.seconds: must be at most"),
        (["--trigger", "every", "--field", "days=1000000000000", *CALL], "trigger.fields.days: must be at most"),
        (["--trigger", "calendar_interval", "--field", "years=9000", *CALL], "trigger.fields.years: must be"),
        (["--trigger", "cron", "--field", "month=2", "--field", "day=31", *CALL], "trigger.fields: never fires"),
        (["--timezone", "EST5EDT", "--trigger", "cron", "--field", "hour=3", *CALL], "trigger.timezone: 'EST5EDT'"),
        (["--timezone", "localtime", "--trigger", "cron", "--field", "hour=3", *CALL], "trigger.timezone: 'localtime'"),
        # The kit allows 127.0.0.1 (the test receivers), nothing else that is not public.
        ([*EVERY_FIVE, "--url", "http://169.254.169.254/latest/meta-data/", "--outbox", "scheduled-calls"],
         "target.url: 'http://169.254.169.254/latest/meta-data/': 169.254.169.254 is a link-local"),
        ([*EVERY_FIVE, "--url", "http://127.0.0.2:5432/", "--outbox", "scheduled-calls"], "OUTBOXKIT_URL_ALLOW_LIST"),
        ([*HEARTBEAT, "--header", "Authorization: Bearer abc"], "target.headers: 'Authorization' may not hold a credential"),
        ([*HEARTBEAT, "--header", "Transfer-Encoding: chunked"], "target.headers: Delivery.headers may not set"),
    ],
)
def test_a_refused_create_names_the_field_and_writes_nothing(cli, engine, flags, says):
    code, _, err = cli("schedules", "create", "refused", *flags)
    assert code == 1 and says in err.replace("\n", " "), err
    assert schedule_rows(engine) == [] and audit(engine) == []


def test_create_from_a_json_file_and_unknown_names(cli, engine, tmp_path):
    definition = tmp_path / "nightly.json"
    definition.write_text(json.dumps({
        "trigger": {"kind": "cron", "fields": {"hour": 3, "minute": 30}, "timezone": "Europe/Berlin"},
        "target": {"kind": "http", "url": "http://127.0.0.1:9/nightly", "outbox": "scheduled-calls"},
        "misfire_grace_seconds": 3600,
    }))
    code, _, err = cli("schedules", "create", "nightly", "--file", str(definition), "--grace", "60")
    assert code == 0, err
    with engine.connect() as connection:
        grace = connection.execute(text("SELECT misfire_grace_seconds FROM outboxkit_schedules")).scalar_one()
    assert grace == 60  # a flag given with --file wins
    not_json = tmp_path / "broken.json"
    not_json.write_text("{")
    code, _, err = cli("schedules", "create", "other", "--file", str(not_json))
    assert code == 1 and "--file" in err
    for command in ("enable", "disable", "run-now", "show"):
        code, _, err = cli("schedules", command, "nope")
        assert code == 1 and "no schedule named 'nope'" in err
    code, _, err = cli("schedules", "list", "--tz", "Mars/Olympus")
    assert code == 1 and "unknown IANA timezone" in err


def test_a_schedule_declared_in_code_is_not_edited_or_deleted_from_the_cli(cli, engine):
    from outboxkit.schedules.definitions import JobTarget, ScheduleDefinition, ScheduleTrigger
    from outboxkit.schedules.store import ScheduleStore

    declared = ScheduleDefinition(name="nightly", trigger=ScheduleTrigger.cron(hour=3), target=JobTarget(job="record"))
    ScheduleStore(engine, jobs=["record"]).sync_from_code([declared], origins={"nightly": "shop.schedules:12"})
    for command in (["edit", "nightly", "--field", "hour=4"], ["delete", "nightly", "--yes"]):
        code, _, err = cli("schedules", *command)
        assert code == 1 and "declared in code at shop.schedules:12" in err.replace("\n", " "), err
    assert schedule_rows(engine)[0][:3] == ("nightly", "cron", {"hour": 3})
    assert cli("schedules", "disable", "nightly")[0] == 0
