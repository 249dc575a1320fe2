"""The built wheel carries the admin's templates and stylesheet and serves a page from its installed copy.

The wheel is built from a copy of the project (no build artifacts in the
tree) and installed with ``--no-deps`` into a fresh venv whose dependencies
come from this interpreter's site-packages (a ``.pth`` path entry; no
network).  The page is fetched by a script that runs outside the source tree
and checks that ``outboxkit.admin`` is imported from the venv.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.admin import (
    admin_database_url,  # noqa: F401  (fixture)
    empty_tables,
)
from tests.support.database import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from pathlib import Path

import outboxkit.admin

venv = Path(sys.argv[2]).resolve()
assert Path(outboxkit.admin.__file__).resolve().is_relative_to(venv), outboxkit.admin.__file__

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import String, Text, create_engine
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import Delivery, Outbox, OutboxKit, OutboxOptions
from outboxkit.admin import create_admin_router


class Base(DeclarativeBase):
    pass


class Hook(Outbox, Base):
    __tablename__ = "webhook_outbox"
    __outbox__ = OutboxOptions(job_name="webhooks")
    event: Mapped[str] = mapped_column(String(100))
    target_url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict] = mapped_column(JSONB)

    def build_delivery(self):
        return Delivery(url=self.target_url, json=self.payload)


engine = create_engine(sys.argv[1], pool_size=1)
app = FastAPI()
app.include_router(create_admin_router(OutboxKit(engine, [Hook]), insecure_no_auth=True), prefix="/ops")
with TestClient(app) as client:
    page = client.get("/ops/outboxes/webhooks?status=stuck")
    stylesheet = client.get("/ops/static/admin.css")
    script = client.get("/ops/static/admin.js")  # the viewer's timezone on the schedule pages, local times, live refresh
    schedules = client.get("/ops/schedules")
engine.dispose()
assert page.status_code == 200 and "<h1>webhooks</h1>" in page.text and "No stuck rows" in page.text, page.text[:500]
assert stylesheet.status_code == 200 and stylesheet.text.startswith("/* outboxkit admin"), stylesheet.status_code
assert script.status_code == 200 and "viewerTimes" in script.text, script.status_code
assert schedules.status_code == 200 and "No schedules yet" in schedules.text, schedules.text[:500]
print("served from", Path(outboxkit.admin.__file__).parent)
"""


def _run(command: list[str], **options) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, **options)
    assert result.returncode == 0, f"{command[:4]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.timeout(300)
def test_the_installed_wheel_serves_admin_pages_with_its_packaged_templates(tmp_path, admin_database_url):
    empty_tables(admin_database_url)
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "outboxkit", source / "outboxkit", ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ]
    )
    (wheel,) = (tmp_path / "dist").glob("outboxkit-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    venv_site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    # Dependencies from this interpreter, as a plain path entry: .pth files in it (such
    # as the source tree's editable install) are not processed, so they cannot shadow the wheel.
    (venv_site / "outboxkit_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")

    result = _run(
        [str(python), "-c", SCRIPT, sqlalchemy_url(admin_database_url), str(venv)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert "served from " + str(venv_site.resolve()) in result.stdout
