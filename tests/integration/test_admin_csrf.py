"""The pages' CSRF tokens (bound to the actor, expiring, scoped to the mount) and their signed flash notices."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from outboxkit import OutboxKitSettings
from outboxkit.admin import ACTOR_STATE_ATTRIBUTE, CSRF_COOKIE, create_admin_router
from outboxkit.admin.flash import FLASH_COOKIE, FLASH_SECONDS
from tests.support.admin import (  # noqa: F401  (fixtures)
    add_webhooks,
    admin,
    admin_app,
    admin_database_url,
    admin_harness,
    cookie_named,
    empty_tables,
    row_of,
    snapshot,
)

SECRET = "a shared secret of the admin's workers"
NOTICE = re.compile(r'<p class="alert alert-ok" role="status">([^<]*)</p>')
TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def signed_in_as(request: Request, user: Annotated[str | None, Header(alias="x-user")] = None) -> None:
    """Test auth: the x-user header names the actor (alice or bob)."""
    if user not in ("alice", "bob"):
        raise HTTPException(status_code=401, detail="who are you?")
    setattr(request.state, ACTOR_STATE_ATTRIBUTE, user)


def admin_app_for(kit, prefix: str = "/ops") -> FastAPI:
    app = FastAPI()
    app.include_router(create_admin_router(kit, dependencies=[Depends(signed_in_as)], csrf_secret=SECRET), prefix=prefix)
    return app


@contextmanager
def two_user_client(kit) -> Iterator[TestClient]:
    with TestClient(admin_app_for(kit), follow_redirects=False) as client:
        yield client


@contextmanager
def engine_for(url: str):
    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def _notice(page) -> str | None:
    match = NOTICE.search(page.text)
    return match.group(1) if match else None


def _token(page) -> str:
    return TOKEN.search(page.text).group(1)


# -- CSRF -------------------------------------------------------------------------


def test_a_token_issued_to_one_actor_is_refused_for_another(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    with two_user_client(admin.kit) as client:
        page = client.get(f"/ops/outboxes/webhooks/rows/{row_id}", headers={"x-user": "alice"})
        token = _token(page)
        before = snapshot(admin.engine)
        # Bob's browser holding Alice's cookie and form (a leaked token, or a shared machine).
        response = client.post(
            f"/ops/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": token}, headers={"x-user": "bob"}
        )
        assert response.status_code == 403
        assert snapshot(admin.engine) == before
        # Bob's own page re-issues the token for Bob, and Bob's form then works.
        bob_page = client.get(f"/ops/outboxes/webhooks/rows/{row_id}", headers={"x-user": "bob"})
        assert _token(bob_page) != token
        response = client.post(
            f"/ops/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(bob_page)}, headers={"x-user": "bob"}
        )
        assert response.status_code == 303
        assert row_of(admin.engine, row_id)["status"] == "pending"


def test_an_expired_token_is_refused(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    lifetime = admin.kit.settings.admin_csrf_token_seconds
    token = _token(admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}"))
    before = snapshot(admin.engine)
    admin.clock.advance(seconds=lifetime + 1)
    response = admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": token})
    assert response.status_code == 403 and "expired" in response.text
    assert snapshot(admin.engine) == before


def test_a_page_reissues_the_token_once_half_its_lifetime_is_gone(admin):
    add_webhooks(admin.engine, 1, status="stuck")
    lifetime = admin.kit.settings.admin_csrf_token_seconds
    first = _token(admin.client.get("/admin/outboxes/webhooks"))
    admin.clock.advance(seconds=lifetime / 2 - 5)
    assert _token(admin.client.get("/admin/outboxes/webhooks")) == first
    admin.clock.advance(seconds=10)
    second = admin.client.get("/admin/outboxes/webhooks")
    assert _token(second) != first
    assert cookie_named(admin.client, CSRF_COOKIE).value == _token(second)


def test_the_cookies_are_scoped_to_the_mount_path(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    page = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    set_cookie = page.headers["set-cookie"]
    assert set_cookie.startswith(CSRF_COOKIE + "_")
    assert "Path=/admin;" in set_cookie and "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie
    assert f"Max-Age={admin.kit.settings.admin_csrf_token_seconds}" in set_cookie
    reset = admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(page)})
    flash_cookie = reset.headers["set-cookie"]
    assert flash_cookie.startswith(FLASH_COOKIE + "_") and "Path=/admin;" in flash_cookie
    assert f"Max-Age={FLASH_SECONDS}" in flash_cookie


def test_two_admin_mounts_on_one_host_keep_separate_cookies(admin):
    """Two applications' admins on one host (cookies ignore ports), under /eu/admin and /us/admin, one browser:
    neither logs the other's forms out."""
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    (other_id,) = add_webhooks(admin.engine, 1, status="stuck")
    europe, america = admin_app_for(admin.kit, "/eu/admin"), admin_app_for(admin.kit, "/us/admin")

    async def one_host(scope, receive, send):
        await (europe if scope.get("path", "").startswith("/eu/") else america)(scope, receive, send)

    with TestClient(one_host, follow_redirects=False, headers={"x-user": "alice"}) as browser:
        eu_page = browser.get(f"/eu/admin/outboxes/webhooks/rows/{row_id}")
        us_page = browser.get(f"/us/admin/outboxes/webhooks/rows/{other_id}")
        cookies = {cookie.path: cookie.name for cookie in browser.cookies.jar if cookie.name.startswith(CSRF_COOKIE)}
        assert set(cookies) == {"/eu/admin", "/us/admin"}
        assert cookies["/eu/admin"] != cookies["/us/admin"]
        # The first admin's form still works after the second admin set its cookie.
        eu = browser.post(f"/eu/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(eu_page)})
        us = browser.post(f"/us/admin/outboxes/webhooks/rows/{other_id}/reset", data={"csrf_token": _token(us_page)})
        assert (eu.status_code, us.status_code) == (303, 303)
        assert eu.headers["location"] == f"/eu/admin/outboxes/webhooks/rows/{row_id}"
        # A token of one mount is not a token of the other, even with the same secret and actor.
        cross = browser.post(f"/us/admin/outboxes/webhooks/rows/{other_id}/retry-now", data={"csrf_token": _token(eu_page)})
        assert cross.status_code == 403


# -- flash notices --------------------------------------------------------------------


@pytest.mark.parametrize(
    "query", ["?done=reset", "?done=retry_now", "?done=selected&changed=5000", "?done=bulk&changed=²", "?changed=99"]
)
def test_a_notice_cannot_be_spoofed_with_query_parameters(admin, query):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    for path in (f"/admin/outboxes/webhooks/rows/{row_id}", "/admin/outboxes/webhooks"):
        page = admin.client.get(path + query)
        assert page.status_code == 200
        assert _notice(page) is None, path + query


def test_a_notice_comes_from_the_result_and_shows_once(admin):
    ids = add_webhooks(admin.engine, 3, status="stuck")
    page = admin.client.get("/admin/outboxes/webhooks")
    response = admin.client.post(
        "/admin/outboxes/webhooks/reset-selected", data={"csrf_token": _token(page), "ids": [str(ids[0]), str(ids[1])]}
    )
    assert response.headers["location"] == "/admin/outboxes/webhooks?status=stuck"
    assert _notice(admin.client.get(response.headers["location"])) == "Reset 2 row(s); they are pending and due now."
    assert _notice(admin.client.get(response.headers["location"])) is None

    # Resetting the same row again changes nothing, and the notice says so.
    token = cookie_named(admin.client, CSRF_COOKIE).value  # the page shows no reset form for a pending row
    again = admin.client.post(f"/admin/outboxes/webhooks/rows/{ids[0]}/reset", data={"csrf_token": token})
    assert _notice(admin.client.get(again.headers["location"])).startswith("Nothing to do")


def test_a_forged_expired_or_foreign_flash_shows_nothing(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    detail = admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
    admin.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(detail)})
    flash = cookie_named(admin.client, FLASH_COOKIE)

    admin.clock.advance(seconds=FLASH_SECONDS + 1)
    assert _notice(admin.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")) is None  # expired

    kind, count, expires, signature = flash.value.split(".")
    for forged in (f"reset_many.5000.{expires}.{signature}", f"reset.1.9999999999.{signature}", "x", ""):
        admin.client.cookies.set(flash.name, forged, domain=flash.domain, path=flash.path)
        page = admin.client.get("/admin/outboxes/webhooks")
        assert _notice(page) is None, forged
        assert f'{flash.name}=""' in page.headers["set-cookie"] or "Max-Age=0" in page.headers["set-cookie"]


def test_a_flash_issued_to_one_actor_does_not_show_to_another(admin):
    (row_id,) = add_webhooks(admin.engine, 1, status="stuck")
    with two_user_client(admin.kit) as client:
        detail = client.get(f"/ops/outboxes/webhooks/rows/{row_id}", headers={"x-user": "alice"})
        reset = client.post(
            f"/ops/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(detail)}, headers={"x-user": "alice"}
        )
        assert reset.status_code == 303
        assert _notice(client.get(reset.headers["location"], headers={"x-user": "bob"})) is None


# -- several workers ------------------------------------------------------------------


def test_a_form_rendered_by_one_worker_is_accepted_by_another_with_no_secret_configured(admin_database_url):
    """Two workers (two kits, two routers, no csrf_secret): each signs with the key kept in the database."""
    empty_tables(admin_database_url)
    with admin_harness(admin_database_url) as one, admin_harness(admin_database_url) as other:
        (row_id,) = add_webhooks(one.engine, 1, status="stuck")
        page = one.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
        other.client.cookies.update(one.client.cookies)  # the same browser, sent to the other worker
        response = other.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(page)})
        assert response.status_code == 303, response.text
        assert row_of(one.engine, row_id)["status"] == "pending"


def test_without_the_kits_secret_table_a_refused_form_says_why(admin_database_url):
    empty_tables(admin_database_url)
    with engine_for(admin_database_url) as engine, engine.begin() as connection:
        connection.execute(text("ALTER TABLE outboxkit_secrets RENAME TO outboxkit_secrets_away"))
    try:
        with admin_harness(admin_database_url) as one, admin_harness(admin_database_url) as other:
            (row_id,) = add_webhooks(one.engine, 1, status="stuck")
            page = one.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
            other.client.cookies.update(one.client.cookies)
            before = snapshot(one.engine)
            response = other.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(page)})
            assert response.status_code == 403
            assert "outboxkit_secrets is missing" in response.text and "OUTBOXKIT_ADMIN_SECRET" in response.text
            assert snapshot(one.engine) == before
    finally:
        with engine_for(admin_database_url) as engine, engine.begin() as connection:
            connection.execute(text("ALTER TABLE outboxkit_secrets_away RENAME TO outboxkit_secrets"))


def test_the_admin_secret_setting_signs_for_every_worker(admin_database_url):
    empty_tables(admin_database_url)
    settings = OutboxKitSettings(admin_secret="a key the operator chose, long enough")
    with admin_harness(admin_database_url, settings=settings) as one, \
            admin_harness(admin_database_url, settings=settings) as other:
        (row_id,) = add_webhooks(one.engine, 1, status="stuck")
        page = one.client.get(f"/admin/outboxes/webhooks/rows/{row_id}")
        other.client.cookies.update(one.client.cookies)
        response = other.client.post(f"/admin/outboxes/webhooks/rows/{row_id}/reset", data={"csrf_token": _token(page)})
        assert response.status_code == 303
    with engine_for(admin_database_url) as engine, engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM outboxkit_secrets")).scalar_one() == 0  # none generated
