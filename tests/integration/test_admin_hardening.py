"""The admin's HTTP edge under attack: odd input, huge bodies, loose types, framing, a database that is away.

Each test names one item of the hardening list in docs/admin.md ("Hardening").
"""

from __future__ import annotations

import base64
import json
import socket
from urllib.parse import urlsplit

import pytest

from outboxkit import OutboxKitSettings
from outboxkit.admin import CSRF_COOKIE
from outboxkit.admin.route_guard import SECURITY_HEADERS
from tests.integration.test_admin_security import EVERY_ROUTE
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

CAP = OutboxKitSettings().admin_max_body_bytes
RESET = "/admin/api/outboxes/webhooks/reset"
JSON = {"content-type": "application/json"}


# -- no query parameter, header or body produces a 5xx ----------------------------

# The 4xx cases with Unicode digits and other non-ASCII input are in the bad-input
# lists of tests/integration/test_admin_security.py (API) and tests/integration/test_admin_pages.py (pages).


@pytest.mark.parametrize(
    "query",
    [
        "?changed=²",  # was a 500: "²".isdigit() is true, int("²") raises
        "?done=²&changed=١٢",
        "?error_contains=%ED%A0%80",  # not UTF-8: decoded with U+FFFD, matched as text
        "?error_contains=%E2%80%AE%F0%9F%92%A5",
    ],
)
def test_non_ascii_query_values_that_are_not_errors_render_the_page(admin, query):
    add_webhooks(admin.engine, 2, status="stuck")
    assert admin.client.get("/admin/outboxes/webhooks" + query).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"cookie": "outboxkit_csrf_x=²; outboxkit_flash_y=reset.1.²."},
        {"cookie": "=\xff\xfe; ;;; a"},
        {"user-agent": "\xe9\xff", "accept-language": "²", "referer": "http://exa\xefmple/"},
        {"x-forwarded-for": "²", "content-type": "text/html; charset=\xff"},
    ],
)
def test_non_ascii_headers_never_produce_a_5xx(admin, headers):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    encoded = {name: value.encode("latin-1") for name, value in headers.items()}
    for method, path, _ in EVERY_ROUTE:
        path = path.replace("/rows/1", f"/rows/{row_id}")
        response = admin.client.request(method, path, headers=encoded)
        assert response.status_code < 500, (method, path, response.status_code)


def test_non_ascii_credentials_are_refused_with_401(admin):
    response = admin.client.get("/admin/", auth=None, headers={"authorization": "Basic ²²²".encode()})
    assert response.status_code == 401
    response = admin.client.get("/admin/", auth=("ädmin", "pässword²"))
    assert response.status_code == 401


def test_unicode_digits_in_form_fields_are_refused_and_change_nothing(admin):
    ids = add_webhooks(admin.engine, 2, status="stuck")
    page = admin.client.get("/admin/outboxes/webhooks")
    token = cookie_named(admin.client, CSRF_COOKIE).value
    assert page.status_code == 200
    before = snapshot(admin.engine)
    for bad in ("²", "１", "١", f" {ids[0]}", f"{ids[0]}_0", "0", "-1"):
        response = admin.client.post("/admin/outboxes/webhooks/reset-selected", data={"csrf_token": token, "ids": [bad]})
        assert response.status_code == 422, (bad, response.status_code)
    response = admin.client.post("/admin/outboxes/webhooks/bulk-reset", data={"csrf_token": token, "status_code": "４００"})
    assert response.status_code == 422
    assert snapshot(admin.engine) == before


# -- bodies are read after auth, and capped ----------------------------------------


class CountingBody:
    """A request body produced lazily in 1 MiB chunks; counts how many the server pulled."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.pulled = 0

    def __iter__(self):
        for _ in range(self.chunks):
            self.pulled += 1
            yield b" " * (1 << 20)


def test_an_unauthenticated_huge_post_is_refused_401_without_reading_its_body(admin):
    for path in (RESET, "/admin/outboxes/webhooks/reset-selected"):
        body = CountingBody(510)
        headers = {**JSON, "content-length": str(510 << 20)}
        response = admin.client.post(path, content=body, headers=headers, auth=None)
        assert response.status_code == 401
        assert body.pulled == 0, path


@pytest.mark.parametrize("path", [RESET, "/admin/api/outboxes/webhooks/reset-matching"])
def test_an_authenticated_post_over_the_cap_gets_413_before_its_body_is_read(admin, path):
    add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    body = CountingBody(510)
    response = admin.client.post(path, content=body, headers={**JSON, "content-length": str(510 << 20)})
    assert response.status_code == 413
    assert "larger than 65,536 bytes" in response.json()["detail"]
    assert body.pulled == 0
    assert snapshot(admin.engine) == before


def test_a_chunked_post_over_the_cap_gets_413_and_changes_nothing(admin):
    ids = add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    # Valid JSON, padded past the cap with whitespace, sent without a Content-Length.
    padded = json.dumps({"ids": ids}).encode() + b" " * CAP

    def chunks():
        for start in range(0, len(padded), 4096):
            yield padded[start : start + 4096]

    response = admin.client.post(RESET, content=chunks(), headers=JSON)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert snapshot(admin.engine) == before

    under = json.dumps({"ids": ids}).encode() + b" " * (CAP - 100)
    assert admin.client.post(RESET, content=iter([under]), headers=JSON).status_code == 200


def test_a_form_post_over_the_cap_gets_the_413_page_and_changes_nothing(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    admin.client.get("/admin/outboxes/webhooks")
    token = cookie_named(admin.client, CSRF_COOKIE).value
    before = snapshot(admin.engine)
    response = admin.client.post(
        "/admin/outboxes/webhooks/reset-selected", data={"csrf_token": token, "ids": [str(row_id)], "pad": "x" * CAP}
    )
    assert response.status_code == 413
    assert "larger than 65,536 bytes" in response.text and "<h1>Not done</h1>" in response.text
    assert snapshot(admin.engine) == before


def test_the_body_cap_is_a_setting(admin_database_url):
    settings = OutboxKitSettings(admin_max_body_bytes=2048)
    with admin_harness(admin_database_url, settings=settings) as harness:
        body = json.dumps({"ids": [2**63 - 1]}) + " " * 2048
        assert harness.client.post(RESET, content=body, headers=JSON).status_code == 413
        assert harness.client.post(RESET, content=body[:2000], headers=JSON).status_code == 404


def _raw_exchange(base_url: str, head: str, body: bytes = b"") -> bytes:
    """Send a request head (and maybe part of a body) over a real socket; read the answer's status line and headers."""
    address = urlsplit(base_url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as connection:
        connection.sendall(head.encode("latin-1") + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = connection.recv(65536)
            if not data:
                break
            answer += data
    return answer


def test_a_real_server_answers_a_510_mb_announcement_at_once_without_waiting_for_the_body(admin_database_url):
    """uvicorn hands the request over before the body; the admin answers from the headers alone."""
    with admin_harness(admin_database_url) as harness, ServedApp(harness.app) as base_url:
        head = (
            "POST /admin/api/outboxes/webhooks/reset HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {510 << 20}\r\n"
        )
        refused = _raw_exchange(base_url, head + "\r\n")
        assert refused.startswith(b"HTTP/1.1 401"), refused[:200]

        credentials = base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
        too_large = _raw_exchange(base_url, head + f"Authorization: Basic {credentials}\r\n\r\n")
        assert too_large.startswith(b"HTTP/1.1 413"), too_large[:200]

        # Chunked, no Content-Length: one chunk past the cap, and the rest never sent.
        chunked_head = (
            "POST /admin/api/outboxes/webhooks/reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\nAuthorization: Basic {credentials}\r\n\r\n"
        )
        chunk = b" " * (CAP + 1)
        cut_off = _raw_exchange(base_url, chunked_head, f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        assert cut_off.startswith(b"HTTP/1.1 413"), cut_off[:200]


# -- security headers ----------------------------------------------------------------


@pytest.mark.parametrize("signed_in", [True, False])
def test_every_admin_answer_carries_the_security_headers(admin, signed_in):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    for method, path, body in EVERY_ROUTE + [
        ("GET", "/admin/outboxes/nope", None),
        ("GET", "/admin/api/outboxes/x/rows/0", None),
    ]:
        path = path.replace("/rows/1", f"/rows/{row_id}")
        response = admin.client.request(method, path, json=body, auth=None if signed_in else ("admin", "wrong"))
        for name, value in SECURITY_HEADERS.items():
            if name == "cache-control" and path.endswith("admin.css"):
                continue
            assert response.headers.get(name) == value, (method, path, response.status_code, name)
    policy = SECURITY_HEADERS["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    assert "script-src 'self';" in policy and "unsafe" not in policy  # the vendored file only: no inline script
    css = admin.client.get("/admin/static/admin.css")
    assert css.headers["cache-control"] == "max-age=3600" and css.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("signed_in", [True, False])
def test_an_unknown_path_or_method_under_the_admin_prefix_carries_the_security_headers(admin, signed_in):
    signed = {} if signed_in else {"auth": ("admin", "wrong")}
    for method, path, expected in [
        ("GET", "/admin/no-such-page", 404),
        ("GET", "/admin/api/no/such/thing", 404),
        ("POST", "/admin/", 405),
        ("DELETE", "/admin/api/outboxes", 405),
    ]:
        response = admin.client.request(method, path, **signed)
        assert response.status_code == (expected if signed_in else 401), (method, path)
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (method, path, response.status_code, name)
        if signed_in and expected == 405:
            assert "GET" in response.headers["allow"]
    assert admin.client.get("/not-the-admin").status_code == 404  # the application's own paths are its own


# -- strict input types ---------------------------------------------------------------

LOOSE_BOOLEANS = ["no", "off", "0", 0, 1, "false", "", None, [], {}]


@pytest.mark.parametrize("dry_run", LOOSE_BOOLEANS)
def test_dry_run_accepts_only_json_booleans(admin, dry_run):
    add_webhooks(admin.engine, 3, status="stuck")
    before = snapshot(admin.engine)
    response = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"dry_run": dry_run})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "dry_run"]
    assert snapshot(admin.engine) == before


@pytest.mark.parametrize("loose_id", [True, "1", 1.0, "0x1", [1], {"id": 1}])
@pytest.mark.parametrize("action", ["reset", "retry-now"])
def test_ids_accept_only_json_integers(admin, loose_id, action):
    add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    response = admin.client.post(f"/admin/api/outboxes/webhooks/{action}", json={"ids": [loose_id]})
    assert response.status_code == 422, response.text
    assert snapshot(admin.engine) == before


@pytest.mark.parametrize("raw", [b'{"ids": [1.0]}', b'{"ids": [1e0]}', b'{"ids": [true]}', b'{"ids": [1], "ids": ["1"]}'])
def test_number_spellings_that_are_not_integer_literals_are_not_ids(admin, raw):
    add_webhooks(admin.engine, 1, status="stuck")
    before = snapshot(admin.engine)
    assert admin.client.post(RESET, content=raw, headers=JSON).status_code == 422
    assert snapshot(admin.engine) == before


def test_json_booleans_and_integers_still_pass(admin):
    ids = add_webhooks(admin.engine, 2, status="stuck", status_code=422)
    dry = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"dry_run": True, "status_code": 422})
    assert dry.status_code == 200 and dry.json()["matched"] == 2 and dry.json()["changed"] == 0
    assert (
        admin.client.post(
            "/admin/api/outboxes/webhooks/reset-matching", json={"status_code": "422", "dry_run": False}
        ).status_code
        == 422
    )
    real = admin.client.post("/admin/api/outboxes/webhooks/reset-matching", json={"dry_run": False})
    assert real.status_code == 200 and sorted(real.json()["sample_ids"]) == ids and real.json()["changed"] == 2


# -- the OpenAPI schema states exact integers --------------------------------------


def test_the_openapi_schema_publishes_the_id_bounds_as_exact_integers(admin):
    raw = admin.client.get("/openapi.json").text
    assert "e+18" not in raw and "9.223372036854776" not in raw
    schema = json.loads(raw)
    body = schema["paths"]["/admin/api/outboxes/{outbox}/reset"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    item = body["properties"]["ids"]["items"]
    assert item["maximum"] == 2**63 - 1 and type(item["maximum"]) is int and item["minimum"] == 1
    match = schema["paths"]["/admin/api/outboxes/{outbox}/reset-matching"]["post"]["requestBody"]["content"]["application/json"]
    assert match["schema"]["properties"]["dry_run"] == {
        "default": True,
        "description": "Count and sample only; nothing changes. A JSON boolean; defaults to true.",
        "title": "Dry Run",
        "type": "boolean",
    }
    # And a valid id at the very top of the range is taken as an id (unknown: 404), not refused.
    response = admin.client.post(RESET, json={"ids": [2**63 - 1]})
    assert response.status_code == 404, response.text
