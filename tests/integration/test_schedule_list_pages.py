"""The schedules list a page at a time, against the real database: the operator layer, the JSON API and the CLI.

Pages run in name order (a keyset on the name, cursors as the rows of an
outbox use them): the first page, the next, the last, back again; a cursor
whose schedule was deleted meanwhile still leads on; the next fire times are
computed for the page's schedules only; a bad cursor or a page size out of
range is refused with the field named, and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from outboxkit import ManualClock
from outboxkit.errors import InvalidCursor, InvalidValueError
from outboxkit.operations import schedule_admin as schedule_admin_module
from outboxkit.operations.cursor import encode_cursor
from outboxkit.operations.schedule_admin import ScheduleAdmin
from outboxkit.operations.schedule_schemas import ScheduleCreate
from tests.support.cli import cli_fixture
from tests.support.schedule_admin import JOBS, ScheduleAdminApp, schedule_admin_app

START = datetime(2026, 3, 27, 12, 0, tzinfo=timezone.utc)
NAMES = [f"report-{number}" for number in range(1, 8)]  # seven schedules: pages of three hold 3, 3 and 1

cli = cli_fixture(["--app", "tests.support.schedule_admin:kit_from_environment"])


def request(name: str) -> ScheduleCreate:
    return ScheduleCreate.model_validate({
        "name": name,
        "trigger": {"kind": "cron", "fields": {"hour": 3, "minute": 30}, "timezone": "Europe/Berlin"},
        "target": {"kind": "http", "url": "http://127.0.0.1:9/report", "outbox": "scheduled-calls"},
    })


@pytest.fixture
def app(database_url: str) -> Iterator[ScheduleAdminApp]:
    with schedule_admin_app(database_url, clock=ManualClock(START)) as app:
        admin = ScheduleAdmin(app.kit, jobs=JOBS)
        for name in reversed(NAMES):  # created out of order: the list's order is the names'
            admin.create(request(name), actor="alice")
        yield app


@pytest.fixture
def admin(app: ScheduleAdminApp) -> ScheduleAdmin:
    return ScheduleAdmin(app.kit, jobs=JOBS)


def state(app: ScheduleAdminApp) -> list[tuple[object, ...]]:
    """Every schedule row and audit entry: equal states mean nothing changed."""
    with app.engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM outboxkit_schedules ORDER BY id")).all()
        audit = connection.execute(text("SELECT id FROM outboxkit_schedule_audit ORDER BY id")).all()
    return [tuple(row) for row in rows] + [("audit", *[row[0] for row in audit])]


def names(view) -> list[str]:
    return [schedule.name for schedule in view.schedules]


def test_the_operator_pages_through_the_schedules_by_name_and_back(admin: ScheduleAdmin):
    first = admin.overview(limit=3)
    assert names(first) == NAMES[:3] and first.limit == 3
    assert first.previous_cursor is None and first.next_cursor is not None
    assert all(len(schedule.next_fire_times) == 5 for schedule in first.schedules)

    second = admin.overview(limit=3, cursor=first.next_cursor)
    assert names(second) == NAMES[3:6] and second.previous_cursor is not None
    last = admin.overview(limit=3, cursor=second.next_cursor)
    assert names(last) == NAMES[6:] and last.next_cursor is None and last.previous_cursor is not None

    back = admin.overview(limit=3, cursor=last.previous_cursor)
    assert names(back) == NAMES[3:6] and back.next_cursor is not None
    front = admin.overview(limit=3, cursor=back.previous_cursor)
    assert names(front) == NAMES[:3] and front.previous_cursor is None and front.next_cursor is not None

    whole = admin.overview(limit=7)
    assert names(whole) == NAMES and whole.next_cursor is None and whole.previous_cursor is None
    assert names(admin.overview()) == NAMES  # the default page (50) holds them all


def test_a_cursor_leads_on_after_its_schedule_was_deleted(admin: ScheduleAdmin):
    first = admin.overview(limit=3)
    admin.delete(NAMES[2], actor="bob")  # the first page's last schedule: the one its next_cursor points after
    assert names(admin.overview(limit=3, cursor=first.next_cursor)) == NAMES[3:6]


def test_the_fire_times_are_computed_for_the_pages_schedules_only(admin: ScheduleAdmin, monkeypatch):
    computed: list[str] = []
    original = schedule_admin_module.next_fire_times

    def counted(schedule, **options):
        computed.append(schedule.name)
        return original(schedule, **options)

    monkeypatch.setattr(schedule_admin_module, "next_fire_times", counted)
    page = admin.overview(limit=2, cursor=admin.overview(limit=2).next_cursor)
    assert names(page) == NAMES[2:4]
    assert computed == [*NAMES[:2], *NAMES[2:4]]  # two pages read, two schedules each


@pytest.mark.parametrize("limit", [0, -1, 201, True, "3"])
def test_a_page_size_out_of_range_is_refused_naming_limit(app: ScheduleAdminApp, admin: ScheduleAdmin, limit):
    before = state(app)
    with pytest.raises(InvalidValueError, match="^limit must be a whole number from 1 to 200"):
        admin.overview(limit=limit)
    assert state(app) == before


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor",
        "e30",  # {}: decodes, but is no cursor
        encode_cursor("rows:stuck", (5,)),  # another listing's
        encode_cursor("schedules", (5,)),  # a number where a name belongs
        encode_cursor("schedules", ("x" * 201,)),  # longer than any name
        "A" * 513,
    ],
)
def test_a_bad_cursor_is_refused_and_changes_nothing(app: ScheduleAdminApp, admin: ScheduleAdmin, cursor: str):
    before = state(app)
    with pytest.raises(InvalidCursor, match="cursor"):
        admin.overview(limit=3, cursor=cursor)
    assert state(app) == before


def test_the_api_pages_through_the_schedules(app: ScheduleAdminApp):
    def page(**params: object) -> dict:
        answer = app.client.get("/admin/api/schedules", params={"limit": 3, **params})
        assert answer.status_code == 200, answer.text
        return answer.json()

    first = page(viewer_timezone="Asia/Tokyo")
    assert [entry["name"] for entry in first["schedules"]] == NAMES[:3] and first["previous_cursor"] is None
    assert first["schedules"][0]["next_fire_times"][0]["viewer"].endswith("+09:00")
    second = page(cursor=first["next_cursor"])
    assert [entry["name"] for entry in second["schedules"]] == NAMES[3:6]
    last = page(cursor=second["next_cursor"])
    assert [entry["name"] for entry in last["schedules"]] == NAMES[6:] and last["next_cursor"] is None
    assert [entry["name"] for entry in page(cursor=last["previous_cursor"])["schedules"]] == NAMES[3:6]
    default = app.client.get("/admin/api/schedules").json()
    assert default["limit"] == 50 and len(default["schedules"]) == 7 and default["next_cursor"] is None


def test_the_api_refuses_a_bad_cursor_with_400_and_a_page_size_out_of_range_with_422(app: ScheduleAdminApp):
    before = state(app)
    for limit in ("0", "201", "ten"):
        answer = app.client.get("/admin/api/schedules", params={"limit": limit})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["query", "limit"]
    for cursor in ("not a cursor", encode_cursor("rows:stuck", (5,))):
        answer = app.client.get("/admin/api/schedules", params={"cursor": cursor})
        assert answer.status_code == 400, answer.text
        assert "cursor" in answer.json()["detail"]
    assert app.client.get("/admin/api/schedules", params={"cursor": "x" * 513}).status_code == 422
    assert state(app) == before


def test_the_cli_pages_through_the_schedules(app: ScheduleAdminApp, cli):
    code, out, err = cli("schedules", "list", "--limit", "3")
    assert code == 0, err
    assert [name for name in NAMES if name in out] == NAMES[:3]
    (more,) = [line for line in out.splitlines() if line.startswith("more: --cursor ")]
    code, out, err = cli("--json", "schedules", "list", "--limit", "3", "--cursor", more.removeprefix("more: --cursor "))
    second = json.loads(out)
    assert code == 0 and [entry["name"] for entry in second["schedules"]] == NAMES[3:6]
    code, out, err = cli("schedules", "list", "--limit", "3", "--cursor", second["next_cursor"])
    assert code == 0 and [name for name in NAMES if name in out] == NAMES[6:] and "more:" not in out


def test_the_cli_refuses_a_bad_cursor_or_page_size_naming_it_and_changes_nothing(app: ScheduleAdminApp, cli):
    before = state(app)
    for limit in ("0", "201"):
        code, _, err = cli("schedules", "list", "--limit", limit)
        assert code == 2 and "--limit" in err
    code, _, err = cli("schedules", "list", "--cursor", "not a cursor")
    assert code == 1 and "cursor does not decode" in err
    assert state(app) == before
