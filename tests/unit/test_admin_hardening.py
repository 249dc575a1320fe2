"""The admin with its database away: every page, form and API call answers 503, after auth.

The rest of the hardening list in docs/admin.md ("Hardening") is in tests/integration/test_admin_hardening.py.
"""

from __future__ import annotations

import socket

import pytest
from exampleapp.admin_app import create_app
from fastapi.testclient import TestClient

from tests.support.admin import (  # noqa: F401  (fixtures)
    ADMIN_PASSWORD,
    ADMIN_USER,
    ServedApp,
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    cookie_named,
    snapshot,
)

# -- database unreachable -------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def unreachable() -> TestClient:
    app = create_app(f"postgresql://root@127.0.0.1:{_closed_port()}/gone", admin_password=ADMIN_PASSWORD, pool_size=1)
    with TestClient(app, follow_redirects=False) as client:
        client.auth = (ADMIN_USER, ADMIN_PASSWORD)
        yield client


@pytest.mark.parametrize(
    "path",
    [
        "/admin/",
        "/admin/outboxes/webhooks",
        "/admin/outboxes/webhooks/rows/1",
        "/admin/outboxes/webhooks/bulk-reset",
        "/admin/audit",
        "/admin/schedules",
        "/admin/destinations",
        "/admin/outboxes/webhooks/destination?name=http://127.0.0.1:9",
    ],
)
def test_with_the_database_unreachable_every_page_says_so_with_503(unreachable, path):
    response = unreachable.get(path)
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("text/html")
    assert "<h1>Database unreachable</h1>" in response.text
    assert "The database is unreachable" in response.text
    assert response.headers["x-frame-options"] == "DENY"


def test_with_the_database_unreachable_a_form_post_gets_the_503_page(unreachable):
    page = unreachable.get("/admin/")  # the signing key is kept in that database: the error page has no token
    assert page.status_code == 503 and "set-cookie" not in page.headers
    response = unreachable.post("/admin/outboxes/webhooks/rows/1/reset", data={"csrf_token": "anything"})
    assert response.status_code == 503 and "Database unreachable" in response.text


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/api/outboxes", None),
        ("GET", "/admin/api/outboxes/webhooks/rows", None),
        ("GET", "/admin/api/outboxes/webhooks/rows/1", None),
        ("GET", "/admin/api/audit", None),
        ("GET", "/admin/api/jobs", None),
        ("POST", "/admin/api/outboxes/webhooks/reset", {"ids": [1]}),
        ("POST", "/admin/api/outboxes/webhooks/reset-matching", {"dry_run": False}),
    ],
)
def test_with_the_database_unreachable_the_api_answers_a_json_503(unreachable, method, path, body):
    response = unreachable.request(method, path, json=body)
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    assert response.json()["detail"].startswith("The database is unreachable")


def test_with_the_database_unreachable_auth_still_comes_first(unreachable):
    assert unreachable.get("/admin/", auth=("admin", "wrong")).status_code == 401
