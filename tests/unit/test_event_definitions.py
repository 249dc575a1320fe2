"""A subscription's definition is checked before anything is written; the filters a type matches."""

from __future__ import annotations

import pytest

from outboxkit import InvalidSubscriptionError, SubscriptionDefinition
from outboxkit.events.definitions import filter_candidates
from tests.support.events import secret

URL = "https://hooks.example.com/in"


def make(**overrides: object) -> SubscriptionDefinition:
    fields: dict[str, object] = {"url": URL, "event_types": ["invoice.paid"], "secrets": [secret(1)], **overrides}
    return SubscriptionDefinition(**fields)  # type: ignore[arg-type]


def test_a_type_is_matched_by_its_name_and_each_of_its_prefixes():
    assert filter_candidates("invoice.line.added") == ["invoice.line.added", "invoice.*", "invoice.line.*"]
    assert filter_candidates("ping") == ["ping"]


def test_filters_are_kept_in_order_without_repeats():
    assert make(event_types=["invoice.*", "customer.created", "invoice.*"]).event_types == ("invoice.*", "customer.created")


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ([], "matches no event"),
        (["*"], "would match every event"),
        (["invoice.paid", "*"], "filter #2 '\\*' would match every event"),
        (["invoice..paid"], "neither an event type"),
        (["invoice.*.paid"], "neither an event type"),
        ("invoice.paid", "a list of event types"),
        ([f"type.{number}" for number in range(101)], "at most 100 filters"),
    ],
)
def test_filters_that_match_nothing_everything_or_are_malformed_are_refused(filters, message):
    with pytest.raises(InvalidSubscriptionError, match=message) as refused:
        make(event_types=filters)
    assert refused.value.field == "event_types"


@pytest.mark.parametrize(
    ("secrets", "message"),
    [
        (["not-a-secret"], "#1 .* does not start with 'whsec_'"),
        ([secret(1), "whsec_!!!"], "#2 .* not base64"),
        (["whsec_YWJj"], "decodes to 3 bytes"),
        ([], "at least one"),
        ("whsec_abc", "a list of 'whsec_...' secrets"),
    ],
)
def test_a_secret_in_the_wrong_form_is_refused_by_its_position_never_its_value(secrets, message):
    with pytest.raises(InvalidSubscriptionError, match=message) as refused:
        make(secrets=secrets)
    assert refused.value.field == "secrets"
    assert "!!!" not in str(refused.value) and "YWJj" not in str(refused.value)


def test_several_secrets_are_kept_for_a_rotation_and_never_shown():
    definition = make(secrets=[secret(1), secret(2)])
    assert len(definition.secrets) == 2
    assert secret(1) not in repr(definition)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Host": "internal"}, "frames or routes"),
        ({"Transfer-Encoding": "chunked"}, "frames or routes"),
        ({"webhook-signature": "v1,forged"}, "set by the signature"),
        ({"X-Bad\nName": "1"}, "headers"),
    ],
)
def test_framing_and_signature_headers_are_refused(headers, message):
    with pytest.raises(InvalidSubscriptionError, match=message) as refused:
        make(headers=headers)
    assert refused.value.field == "headers"


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/in", "file:///etc/passwd", "hooks.example.com/in"])
def test_a_url_that_is_not_http_is_refused(url):
    with pytest.raises(InvalidSubscriptionError, match="http") as refused:
        make(url=url)
    assert refused.value.field == "url"


def test_a_tenant_is_none_or_a_short_string():
    assert make(tenant="acme").tenant == "acme"
    with pytest.raises(InvalidSubscriptionError, match="tenant"):
        make(tenant="")
    with pytest.raises(InvalidSubscriptionError, match="tenant"):
        make(tenant="x" * 201)


def test_limits_default_to_the_deliveries_outboxs_own_and_are_kept_as_given():
    assert (make().rate_limit, make().max_in_flight) == (None, None)
    limited = make(rate_limit=5, max_in_flight=2)
    assert (limited.rate_limit, limited.max_in_flight) == (5.0, 2)
    assert isinstance(limited.rate_limit, float)
    assert make(rate_limit=0.5).rate_limit == 0.5


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"rate_limit": 0}, "rate_limit", "rate limit must be more than 0 and at most 1,000,000 requests per second"),
        ({"rate_limit": -1.5}, "rate_limit", "rate limit must be more than 0"),
        ({"rate_limit": 2_000_000}, "rate_limit", "at most 1,000,000 requests per second"),
        ({"rate_limit": float("nan")}, "rate_limit", "rate limit must be a number of requests per second"),
        ({"rate_limit": "5"}, "rate_limit", "rate limit must be a number of requests per second"),
        ({"rate_limit": True}, "rate_limit", "rate limit must be a number of requests per second"),
        ({"max_in_flight": 0}, "max_in_flight", "cap must be from 1 to 10,000 sends in flight"),
        ({"max_in_flight": 10_001}, "max_in_flight", "cap must be from 1 to 10,000 sends in flight"),
        ({"max_in_flight": 1.5}, "max_in_flight", "cap must be a whole number of sends in flight"),
        ({"max_in_flight": False}, "max_in_flight", "cap must be a whole number of sends in flight"),
    ],
)
def test_limits_are_held_to_the_destination_limits_rules_and_the_field_is_named(overrides, field, message):
    with pytest.raises(InvalidSubscriptionError, match=message) as refused:
        make(**overrides)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")
