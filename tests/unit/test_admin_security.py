"""The admin package's surface: its public API, and an install hint without the admin extra.

Auth, bad input and mounting are in tests/integration/test_admin_security.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    snapshot,
)

ROOT = Path(__file__).resolve().parents[2]


def test_without_the_admin_extra_the_import_says_how_to_install_it():
    script = "import sys; sys.modules['jinja2'] = None; import outboxkit.admin"
    environment = {"PYTHONPATH": f"{ROOT}:{ROOT / 'admin'}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=60)
    assert result.returncode != 0
    assert "pip install 'outboxkit[admin]'" in result.stderr
    assert "jinja2 is missing" in result.stderr


def test_the_admin_package_exports_exactly_its_public_api():
    import outboxkit.admin

    assert sorted(outboxkit.admin.__all__) == [
        "ACTOR_STATE_ATTRIBUTE",
        "CSRF_COOKIE",
        "CSRF_FIELD",
        "DRAIN_JOB_PREFIX",
        "JobInfo",
        "JobSource",
        "OperationsService",
        "RowsHeld",
        "RowsNotFound",
        "create_admin_router",
        "create_tenant_router",
        "drain_job_id",
    ]
    assert all(hasattr(outboxkit.admin, name) for name in outboxkit.admin.__all__)
