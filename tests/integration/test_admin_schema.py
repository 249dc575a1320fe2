"""Property-based run of schemathesis against the admin's OpenAPI schema: no input yields a 5xx.

The app is the example admin (real database, HTTP Basic); examples are
bounded and derandomized so the run is quick and repeatable.  Beyond "no 5xx"
every response must match its documented schema.

The schema is loaded at import through ``DeferredApp`` (schemathesis'
``from_fixture`` does not work with pytest 9); a module fixture then points it
at the app on the test database.
"""

from __future__ import annotations

import base64

import pytest
import schemathesis
from exampleapp.admin_app import create_app
from hypothesis import HealthCheck, Phase, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from outboxkit.url_guard import UrlGuard
from tests.support.admin import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    add_webhooks,
    admin_database_url,  # noqa: F401  (fixture)
    admin_harness,
    empty_tables,
)


def _documentation_address(host: str, port: int) -> list[str]:
    """Every host name resolves here, to TEST-NET-1 (refused by the guard): no lookup leaves the machine."""
    return ["192.0.2.1"]


AUTH = {"Authorization": "Basic " + base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()}


class DeferredApp:
    """An ASGI app that forwards to whichever app it currently points at."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


# Serving /openapi.json needs no database connection, so an app on an unused URL describes the API.
deferred = DeferredApp(create_app("postgresql://127.0.0.1:1/schema-only", admin_password=ADMIN_PASSWORD))
schema = schemathesis.openapi.from_asgi("/openapi.json", deferred)


@pytest.fixture(scope="module", autouse=True)
def live_admin(admin_database_url):
    empty_tables(admin_database_url)
    schema_only = deferred.app
    with admin_harness(admin_database_url) as harness:
        add_webhooks(harness.engine, 5, status="stuck", error="HTTP 400 % _ \\ ' OR 1=1--")
        add_webhooks(harness.engine, 3, status="pending")
        add_webhooks(harness.engine, 3, status="done", error=None, status_code=200)
        # Generated bodies carry random URLs (schedules' HTTP targets, subscription endpoints): the URL guard
        # resolves their hosts at save, so its resolver is pinned and no DNS query is sent anywhere.
        harness.kit.url_guard = UrlGuard(allow=harness.kit.url_guard.allow, resolve=_documentation_address)
        deferred.app = harness.app
        try:
            yield harness
        finally:
            deferred.app = schema_only


def _holds_a_float(value) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_holds_a_float(item) for item in value.values())
    return isinstance(value, list) and any(_holds_a_float(item) for item in value)


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_the_admin_api_never_answers_5xx_and_keeps_its_schema(case):
    # A cursor is opaque: any string fits the schema, but only one the API issued decodes (else 400).
    made_up_cursor = bool(case.query and case.query.get("cursor"))
    # JSON Schema counts 192.0 as an integer; the API, by design, takes only integer
    # literals for its integer fields (strict types: 1.0, "1" and true are not row 1,
    # 295.0 is not a status code), so it answers 422.
    float_integer = _holds_a_float(case.body)
    # A schedule's rules (an IANA timezone, a cron field, an http(s) URL, a job this code registers) are more than
    # JSON Schema says: a body or a viewer_timezone that fits the schema may still be refused with 422, naming the field.
    schedule_rules = "/schedules" in case.path or "/subscriptions" in case.path  # the subscription rules likewise
    excluded = [positive_data_acceptance] if made_up_cursor or float_integer or schedule_rules else []
    # The API ignores query parameters it does not declare (FastAPI's way, on every route): a request whose only
    # fault is such a parameter is answered as if it were absent, not refused.
    declared = {parameter.name for parameter in case.operation.query}
    if case.query and set(case.query) - declared:
        excluded.append(negative_data_rejection)
    case.call_and_validate(headers=AUTH, excluded_checks=excluded or None)
