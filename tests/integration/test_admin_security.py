"""The admin refuses what it must: no auth, bad input, non-JSON posts; and it is mounted safely or not at all."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from outboxkit import ConfigurationError
from outboxkit.admin import create_admin_router
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    audit_entries,
    snapshot,
)


def _cursor(document: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


EVERY_ROUTE = [
    ("GET", "/admin/api/outboxes", None),
    ("GET", "/admin/api/outboxes/webhooks/rows", None),
    ("GET", "/admin/api/outboxes/webhooks/rows/1", None),
    ("POST", "/admin/api/outboxes/webhooks/reset", {"ids": [1]}),
    ("POST", "/admin/api/outboxes/webhooks/retry-now", {"ids": [2]}),
    ("POST", "/admin/api/outboxes/webhooks/reset-matching", {"dry_run": False}),
    ("GET", "/admin/api/audit", None),
    ("GET", "/admin/api/jobs", None),
    ("GET", "/admin/", None),
    ("GET", "/admin/outboxes/webhooks", None),
    ("GET", "/admin/outboxes/webhooks/rows/1", None),
    ("POST", "/admin/outboxes/webhooks/rows/1/reset", None),
    ("POST", "/admin/outboxes/webhooks/reset-selected", None),
    ("GET", "/admin/outboxes/webhooks/bulk-reset", None),
    ("POST", "/admin/outboxes/webhooks/bulk-reset", None),
    ("GET", "/admin/audit", None),
    ("GET", "/admin/jobs", None),
    ("GET", "/admin/static/admin.css", None),
]


@pytest.mark.parametrize("credentials", [None, ("admin", "wrong"), ("root", "correct horse battery staple")])
def test_every_route_needs_the_applications_auth_and_changes_nothing_without_it(admin, credentials):
    from datetime import timedelta

    add_webhooks(admin.engine, 1, status="stuck")
    add_webhooks(admin.engine, 1, status="pending", next_attempt_at=admin.clock.now() + timedelta(hours=1))
    before = snapshot(admin.engine)
    for method, path, body in EVERY_ROUTE:
        response = admin.client.request(method, path, json=body, auth=credentials, data=None)
        assert response.status_code == 401, (method, path, response.status_code)
        assert response.headers["www-authenticate"].startswith("Basic")
    assert snapshot(admin.engine) == before


BAD_READS = [
    ("/admin/api/outboxes/nope/rows", 404),
    ("/admin/api/outboxes/webhooks/rows/999999", 404),
    ("/admin/api/outboxes/nope/rows/1", 404),
    *[(f"/admin/api/outboxes/webhooks/rows/{bad}", 422) for bad in ("abc", "-1", "0", "2^63", str(2**63), "1.5", "1e3")],
    *[(f"/admin/api/outboxes/webhooks/rows?limit={bad}", 422) for bad in ("0", "-1", str(10**9), "abc", "201")],
    ("/admin/api/outboxes/webhooks/rows?status=lost", 422),
    ("/admin/api/outboxes/webhooks/rows?status_code=99", 422),
    ("/admin/api/outboxes/webhooks/rows?error_contains=a%00b", 422),
    ("/admin/api/outboxes/webhooks/rows?error_contains=" + "x" * 201, 422),
    ("/admin/api/outboxes/webhooks/rows?cursor=%25%25%25", 400),
    ("/admin/api/outboxes/webhooks/rows?cursor=bm90IGpzb24", 400),
    ("/admin/api/outboxes/webhooks/rows?cursor=" + _cursor({"s": "rows:done", "k": [5]}), 400),
    ("/admin/api/outboxes/webhooks/rows?cursor=" + _cursor({"s": "rows:stuck", "k": ["5"]}), 400),
    ("/admin/api/outboxes/webhooks/rows?cursor=" + _cursor({"s": "rows:stuck", "k": [2**63]}), 400),
    ("/admin/api/outboxes/webhooks/rows?status=pending&cursor=" + _cursor({"s": "rows:pending", "k": ["yesterday", 5]}), 400),
    (
        "/admin/api/outboxes/webhooks/rows?status=pending&cursor="
        + _cursor({"s": "rows:pending", "k": ["2030-01-01T00:00:00", 5]}),
        400,
    ),
    ("/admin/api/audit?cursor=" + _cursor({"s": "rows:stuck", "k": [5]}), 400),
    ("/admin/api/audit?limit=0", 422),
    ("/admin/api/audit?outbox=nope", 404),
    # Unicode digits ("²".isdigit() is true in Python) and other non-ASCII input.
    ("/admin/api/outboxes/webhooks/rows?status_code=²", 422),
    ("/admin/api/outboxes/webhooks/rows?status_code=４００", 422),
    ("/admin/api/outboxes/webhooks/rows?limit=٣", 422),
    ("/admin/api/outboxes/webhooks/rows?cursor=é", 400),
    ("/admin/api/outboxes/webhooks/rows?cursor=²", 400),
    ("/admin/api/outboxes/webhooks/rows/²", 422),
    ("/admin/api/outboxes/webhooks/rows/١", 422),
    ("/admin/api/outboxes/%F0%9F%92%A5/rows", 404),
    ("/admin/api/outboxes/%E2%80%AEevil/rows/1", 404),
    ("/admin/api/audit?limit=¹", 422),
    ("/admin/api/audit?outbox=ü", 404),
]


@pytest.mark.parametrize(("path", "expected"), BAD_READS)
def test_bad_reads_get_a_clear_4xx(admin, path, expected):
    add_webhooks(admin.engine, 2, status="stuck")
    response = admin.client.get(path)
    assert response.status_code == expected, response.text
    assert response.json()["detail"]


BAD_WRITES = [
    ("reset", {"ids": []}, 422),
    ("reset", {"ids": list(range(1, 502))}, 422),
    ("reset", {"ids": ["abc"]}, 422),
    ("reset", {"ids": [-1]}, 422),
    ("reset", {"ids": [2**63]}, 422),
    ("reset", {"ids": [1], "everything": True}, 422),
    ("reset", {}, 422),
    ("reset", [1, 2], 422),
    ("retry-now", {"ids": [0]}, 422),
    ("reset-matching", {"error_contains": "a\u0000b", "dry_run": False}, 422),
    ("reset-matching", {"error_contains": "x" * 201, "dry_run": False}, 422),
    ("reset-matching", {"status_code": 99, "dry_run": False}, 422),
    ("reset-matching", {"status_code": "4xx", "dry_run": False}, 422),
    ("reset-matching", {"dry_run": "maybe"}, 422),
    ("reset", {"ids": ["²"]}, 422),
    ("reset", {"ids": ["１"]}, 422),
    ("reset-matching", {"status_code": "４００", "dry_run": False}, 422),
    ("reset-matching", {"dry_run": "²"}, 422),
    ("reset-matching", {"status_code": 422.0, "dry_run": False}, 422),
]


@pytest.mark.parametrize(("action", "body", "expected"), BAD_WRITES)
def test_bad_writes_get_a_clear_4xx_and_change_nothing(admin, action, body, expected):
    add_webhooks(admin.engine, 3, status="stuck")
    before = snapshot(admin.engine)
    response = admin.client.post(f"/admin/api/outboxes/webhooks/{action}", json=body)
    assert response.status_code == expected, response.text
    assert snapshot(admin.engine) == before


@pytest.mark.parametrize(
    ("content", "headers", "expected"),
    [
        ('{"ids": [1]}', {"content-type": "text/plain"}, 415),
        ('{"ids": [1]}', {}, 415),
        ("ids=1", {"content-type": "application/x-www-form-urlencoded"}, 415),
        ('{"ids": [1', {"content-type": "application/json"}, 422),
        (b'{"error_contains": "\xff"}', {"content-type": "application/json"}, 400),
    ],
)
def test_api_posts_accept_only_well_formed_json(admin, content, headers, expected):
    add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    target = "reset-matching" if b"error" in (content if isinstance(content, bytes) else content.encode()) else "reset"
    response = admin.client.post(f"/admin/api/outboxes/webhooks/{target}", content=content, headers=headers)
    assert response.status_code == expected, response.text
    assert snapshot(admin.engine) == before


def test_lone_surrogates_in_a_filter_are_refused_not_crashed_on(admin):
    response = admin.client.post(
        "/admin/api/outboxes/webhooks/reset-matching",
        content=b'{"error_contains": "\\ud800"}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422


def test_mounting_without_an_auth_dependency_is_refused(admin):
    with pytest.raises(ConfigurationError, match="insecure_no_auth=True"):
        create_admin_router(admin.kit)
    with pytest.raises(ConfigurationError, match="Depends"):
        create_admin_router(admin.kit, dependencies=[lambda: None])
    with pytest.raises(ConfigurationError, match="16 bytes"):
        create_admin_router(admin.kit, dependencies=[Depends(lambda: None)], csrf_secret="short")
    with pytest.raises(ConfigurationError, match="page_size"):
        create_admin_router(admin.kit, dependencies=[Depends(lambda: None)], page_size=0)


def test_insecure_mode_must_be_named_and_audits_an_anonymous_actor(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    app = FastAPI()
    app.include_router(create_admin_router(admin.kit, insecure_no_auth=True), prefix="/ops")
    with TestClient(app) as client:
        response = client.post("/ops/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    assert response.status_code == 200
    assert audit_entries(admin.engine)[-1]["actor"] == "anonymous (insecure_no_auth)"


def test_a_custom_actor_dependency_names_who_acted(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    app = FastAPI()
    router = create_admin_router(admin.kit, dependencies=[Depends(lambda: None)], actor=lambda: "ops@example.com")
    app.include_router(router, prefix="/admin")
    with TestClient(app) as client:
        client.post("/admin/api/outboxes/webhooks/reset", json={"ids": [row_id]})
    assert audit_entries(admin.engine)[-1]["actor"] == "ops@example.com"


def test_the_admin_can_be_kept_out_of_the_hosts_openapi_schema(admin):
    guard = [Depends(lambda: None)]
    listed, unlisted = FastAPI(), FastAPI()
    listed.include_router(create_admin_router(admin.kit, dependencies=guard), prefix="/admin")
    unlisted.include_router(create_admin_router(admin.kit, dependencies=guard, include_in_schema=False), prefix="/admin")

    @unlisted.get("/orders")
    def orders() -> list[str]:
        return []

    with TestClient(listed) as client:
        assert any(path.startswith("/admin/") for path in client.get("/openapi.json").json()["paths"])
    with TestClient(unlisted) as client:
        assert list(client.get("/openapi.json").json()["paths"]) == ["/orders"]
        assert client.get("/admin/api/outboxes").status_code == 200  # still served, only not listed


def test_the_admin_included_without_a_prefix_leaves_the_hosts_other_paths_alone(admin):
    app = FastAPI()
    app.include_router(create_admin_router(admin.kit, dependencies=[Depends(lambda: None)]))

    @app.get("/orders")
    def orders() -> list[str]:
        return ["kept"]

    with TestClient(app) as client:
        assert client.get("/orders").json() == ["kept"]  # included after the admin, still reached
        assert client.get("/api/outboxes").status_code == 200


def test_an_auth_dependency_that_cannot_read_the_request_is_named_as_the_sign_in(admin):
    from fastapi import Header

    def sign_in(x_admin_token: str = Header()) -> None:
        return None

    app = FastAPI()
    app.include_router(create_admin_router(admin.kit, dependencies=[Depends(sign_in)]), prefix="/admin")
    with TestClient(app) as client:
        page = client.get("/admin/")
        api = client.get("/admin/api/outboxes")

    assert page.status_code == 422 and api.status_code == 422
    assert "Not signed in" in page.text and "bad header" not in page.text
    import html

    shown = html.unescape(page.text)
    assert "the application's sign-in could not read this request: header x-admin-token: Field required" in shown
    assert api.json()["detail"][0]["loc"] == ["header", "x-admin-token"]  # the API keeps FastAPI's shape
