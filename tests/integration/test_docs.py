"""The getting-started guide's code, extracted and run, so the docs cannot rot.

Two mechanisms:

* A Python block whose first line is ``# file: <path>`` is a module of the
  guide's application; the ``myapp`` fixture writes them into a package and
  imports it.
* A block preceded by a ``<!-- doc-test: <action> <arguments> -->`` line is a
  step of a recipe, run in order in a fresh project folder by
  ``run_recipe``.  The actions:

  ``run``                  each line of the (shell) block runs in the
                           project folder, ``bash -e``, with this Python's
                           scripts first on PATH and DATABASE_URL set;
  ``file <path>``          the block is written as the file ``<path>``;
  ``ini <path> <section>`` each ``key = value`` line of the block is set in
                           that section of the ini file ``<path>``;
  ``revision "<message>"`` the block fills the Alembic revision whose
                           message is ``<message>``: its imports go after the
                           file's imports, its functions replace the
                           generated ``upgrade`` and ``downgrade``.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from tests.support.database import libpq_url, sqlalchemy_url

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "getting-started.md"
TESTING_GUIDE = DOCS / "testing.md"


def guide_files(page: Path = GUIDE) -> dict[str, str]:
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", page.read_text(), re.S)
    return {name: code for name, code in blocks}


def test_the_guide_has_the_model_and_the_app():
    assert set(guide_files()) == {"myapp/models.py", "myapp/app.py"}


@pytest.fixture
def myapp(tmp_path, monkeypatch, database_factory, receiver):
    url = database_factory.create_empty()
    for name, code in guide_files().items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(code.replace("http://127.0.0.1:8765", receiver.url))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", sqlalchemy_url(url))
    monkeypatch.setenv("ADMIN_PASSWORD", "s3cret")
    monkeypatch.setenv("OUTBOXKIT_LEADER_TICK_SECONDS", "0.2")
    models = importlib.import_module("myapp.models")
    engine = create_engine(sqlalchemy_url(url))
    from outboxkit.storage.notify import install_trigger_sql
    from outboxkit.storage.tables import kit_metadata

    models.Base.metadata.create_all(engine)
    kit_metadata.create_all(engine)
    with engine.begin() as connection:
        for statement in install_trigger_sql(models.GrantOutbox):
            connection.exec_driver_sql(statement)
    app_module = importlib.import_module("myapp.app")
    yield models, app_module, engine
    app_module.engine.dispose()
    engine.dispose()
    for name in [name for name in sys.modules if name == "myapp" or name.startswith("myapp.")]:
        del sys.modules[name]
    database_factory.drop(url)


def test_the_guide_delivers_a_grant_and_its_admin_resets_a_stuck_row(myapp, receiver):
    from tests.support.receiver import Reply

    models, app_module, engine = myapp
    receiver.respond = lambda request: Reply(status=422) if request.body["amount"] < 0 else Reply()
    with TestClient(app_module.app) as client:  # the lifespan elects this process and starts the schedule
        assert client.post("/grants", params={"workspace": "acme", "amount": 50}).status_code == 201
        assert client.post("/grants", params={"workspace": "acme", "amount": -5}).status_code == 201
        receiver.wait_for(lambda r: len(r.requests) >= 2, timeout=60)  # NOTIFY woke the leader's drain

        def statuses() -> dict[int, str]:
            with Session(engine) as session:
                return dict(session.execute(select(models.GrantOutbox.amount, models.GrantOutbox.status)).all())

        deadline = time.monotonic() + 30
        while statuses() != {50: "done", -5: "stuck"}:
            assert time.monotonic() < deadline, statuses()
            time.sleep(0.05)

        assert client.get("/admin/api/outboxes").status_code == 401
        auth = ("admin", "s3cret")
        stuck = client.get("/admin/api/outboxes/grants/rows", params={"status": "stuck"}, auth=auth).json()["rows"]
        reset = client.post("/admin/api/outboxes/grants/reset", json={"ids": [stuck[0]["id"]]}, auth=auth)
        assert reset.json()["changed"] == 1
        assert statuses()[-5] in ("pending", "stuck")  # reset, then (the receiver still refuses it) parked again
        assert client.get("/admin/", auth=auth).status_code == 200

        def synced() -> list[tuple[str, str]]:  # the schedule declared in the guide, synced into a row at start
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text("SELECT name, defined_in FROM outboxkit_schedules"))]

        deadline = time.monotonic() + 30
        while synced() != [("grants.daily-count", "code")]:
            assert time.monotonic() < deadline, synced()
            time.sleep(0.05)


# -- recipes: the blocks marked <!-- doc-test: ... --> ----------------------------

STEP = re.compile(r"^<!-- doc-test: (\w+)((?: [^\n]*?)?) -->\n```\w*\n(.*?)^```", re.S | re.M)
INI_SETTING = re.compile(r"^(\w+)\s*=\s*(.*)$")


@dataclass(frozen=True)
class Step:
    action: str
    arguments: list[str]
    code: str


def recipe_steps(page: Path) -> list[Step]:
    return [Step(action, shlex.split(arguments or ""), code) for action, arguments, code in STEP.findall(page.read_text())]


def run_recipe(steps: list[Step], project: Path, environment: dict[str, str]) -> list[str]:
    """Apply each step in ``project``; returns what each ``run`` step printed."""
    printed = []
    for step in steps:
        if step.action == "run":
            done = subprocess.run(
                ["bash", "-e", "-c", step.code], cwd=project, env=environment, capture_output=True, text=True, timeout=240
            )
            assert done.returncode == 0, f"{step.code}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
            printed.append(done.stdout + done.stderr)
        elif step.action == "file":
            [path] = step.arguments
            (project / path).write_text(step.code)
        elif step.action == "ini":
            path, section = step.arguments
            set_ini(project / path, section, step.code)
        elif step.action == "revision":
            [message] = step.arguments
            fill_revision(project, message, step.code)
        else:
            raise AssertionError(f"unknown doc-test action {step.action!r}")
    return printed


def set_ini(path: Path, section: str, block: str) -> None:
    """Set each ``key = value`` of ``block`` in ``[section]``, replacing the key's line if it is there."""
    lines = path.read_text().splitlines()
    start = lines.index(f"[{section}]") + 1
    end = next((index for index in range(start, len(lines)) if lines[index].startswith("[")), len(lines))
    for line in block.splitlines():
        setting = INI_SETTING.match(line)
        if setting is None:
            continue
        key = setting.group(1)
        existing = [index for index in range(start, end) if (found := INI_SETTING.match(lines[index])) and found.group(1) == key]
        if existing:
            lines[existing[0]] = line
        else:
            lines.insert(start, line)
            end += 1
    path.write_text("\n".join(lines) + "\n")


def fill_revision(project: Path, message: str, block: str) -> None:
    versions = project / "migrations" / "versions"
    [path] = [path for path in versions.glob("*.py") if path.read_text().startswith(f'"""{message}\n')]
    generated = path.read_text()
    header = generated[: generated.index("\n\ndef upgrade()")]
    imports, _, functions = block.partition("\n\ndef ")
    header = header.replace("import sqlalchemy as sa\n", f"import sqlalchemy as sa\n{imports}\n", 1)
    path.write_text(f"{header}\n\n\ndef {functions}")


def test_the_guide_marks_its_alembic_recipe():
    actions = [step.action for step in recipe_steps(GUIDE)]
    assert actions == ["run", "ini", "file", "run", "revision", "run"]


def test_the_alembic_recipe_gives_the_app_its_own_branch_tables_and_triggers(tmp_path, database_factory):
    import outboxkit.migrations

    url = database_factory.create_empty()
    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").touch()
    (project / "myapp" / "models.py").write_text(guide_files()["myapp/models.py"])
    environment = {
        **os.environ,
        "DATABASE_URL": sqlalchemy_url(url),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    kit_versions = sorted(path.name for path in outboxkit.migrations.VERSIONS.iterdir())
    try:
        printed = run_recipe(recipe_steps(GUIDE), project, environment)

        assert "No new upgrade operations detected" in printed[-1]  # the second autogenerate proposes nothing
        assert sorted(path.name for path in outboxkit.migrations.VERSIONS.iterdir()) == kit_versions
        revisions = sorted((project / "migrations" / "versions").glob("*.py"), key=lambda path: "notify" in path.name)
        assert len(revisions) == 2
        first, triggers = (path.read_text() for path in revisions)
        assert "down_revision: Union[str, Sequence[str], None] = None" in first  # a root of its own
        assert "branch_labels: Union[str, Sequence[str], None] = ('myapp',)" in first
        assert "drop_table('outboxkit" not in first  # autogenerate left the kit's tables alone
        assert "install_notify_triggers(GrantOutbox)" in triggers

        engine = create_engine(sqlalchemy_url(url))
        try:
            with engine.connect() as connection:
                tables = set(connection.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
                heads = set(connection.scalars(text("SELECT version_num FROM alembic_version")))
                triggers_installed = list(connection.scalars(text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")))
        finally:
            engine.dispose()
        assert tables == {
            "alembic_version", "grants", "grant_outbox", "outboxkit_job_runs", "outboxkit_job_fences", "outboxkit_reset_audit",
            "outboxkit_attempts", "outboxkit_outbox_pauses", "outboxkit_outbox_minutes", "outboxkit_destinations",
            "outboxkit_schedules", "outboxkit_schedule_leases", "outboxkit_schedule_audit", "outboxkit_ordering_skips",
            "outboxkit_destination_rates", "outboxkit_destination_limits", "outboxkit_secrets", "outboxkit_inbox",
            "outboxkit_inbox_sources",
            "outboxkit_subscriptions", "outboxkit_subscription_audit", "outboxkit_events", "outboxkit_event_types",
            "outboxkit_event_deliveries", "outboxkit_wakeups",
        }
        assert "outboxkit_0021" in heads and len(heads) == 2
        assert sorted(triggers_installed) == [
            "outboxkit_notify_grant_outbox_insert", "outboxkit_notify_outboxkit_event_deliveries_insert",
        ]
        assert_an_insert_notifies(libpq_url(url))

        run_recipe([Step("run", [], "alembic downgrade myapp@base")], project, environment)
        engine = create_engine(sqlalchemy_url(url))
        try:
            with engine.connect() as connection:
                tables = set(connection.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
                functions = list(connection.scalars(text("SELECT proname FROM pg_proc WHERE proname LIKE 'outboxkit%'")))
        finally:
            engine.dispose()
        assert tables == {
            "alembic_version", "outboxkit_job_runs", "outboxkit_job_fences", "outboxkit_reset_audit",
            "outboxkit_attempts", "outboxkit_outbox_pauses", "outboxkit_outbox_minutes", "outboxkit_destinations",
            "outboxkit_schedules", "outboxkit_schedule_leases", "outboxkit_schedule_audit", "outboxkit_ordering_skips",
            "outboxkit_destination_rates", "outboxkit_destination_limits", "outboxkit_secrets", "outboxkit_inbox",
            "outboxkit_inbox_sources",
            "outboxkit_subscriptions", "outboxkit_subscription_audit", "outboxkit_events", "outboxkit_event_types",
            "outboxkit_event_deliveries", "outboxkit_wakeups",
        } and functions == ["outboxkit_notify_outboxkit_event_deliveries"]  # the kit's own outbox's, in the kit's branch
    finally:
        database_factory.drop(url)


def assert_an_insert_notifies(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as writer:
        listener.execute("LISTEN outboxkit_grants")
        writer.execute("INSERT INTO grant_outbox (grant_id, workspace, amount) VALUES (1, 'acme', 5)")
        assert [notification.channel for notification in listener.notifies(timeout=30, stop_after=1)] == ["outboxkit_grants"]


# -- docs/testing.md: its complete example is a project whose tests must pass ------


def test_the_testing_guides_example_passes_its_own_tests(tmp_path):
    from tests.support.database import server_url

    files = guide_files(TESTING_GUIDE)
    assert set(files) == {
        "shop/models.py", "shop/orders.py", "shop/app.py", "tests/conftest.py", "tests/test_orders.py", "tests/test_app.py"
    }
    for name, code in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    (tmp_path / "shop" / "__init__.py").touch()
    environment = {**os.environ, "OUTBOXKIT_TEST_DATABASE_URL": server_url()}
    environment.pop("PYTEST_ADDOPTS", None)

    # Without the plugins of this project's own API tests, which this venv has and an application's would not:
    # importing them (Hypothesis with them) took 2 to 4 s of the run.  outboxkit's plugin still loads by itself.
    quiet = ["-p", "no:cacheprovider", "-p", "no:schemathesis", "-p", "no:hypothesispytest"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *quiet, "tests"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout, done.stdout
