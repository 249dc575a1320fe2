"""The getting-started guide's code, extracted and run, so the docs cannot rot."""

from __future__ import annotations

import importlib
import re
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from tests.support.database import sqlalchemy_url

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"


def guide_files() -> dict[str, str]:
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", GUIDE.read_text(), re.S)
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
    from outboxkit.notify import install_trigger_sql
    from outboxkit.tables import kit_metadata

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
