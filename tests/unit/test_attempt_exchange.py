"""What an HTTP attempt keeps of what it sent and got back: secrets and signatures redacted, everything bounded.

The network is mocked with respx; the guarded transport's secrets go to the
real receiver on 127.0.0.1 (the guard pins a checked address).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from outboxkit.policy import FailureKind
from outboxkit.storage.attempts import request_json, response_json
from outboxkit.transports.base import Delivery
from outboxkit.transports.exchange import MAX_HEADERS, RESPONSE_EXCERPT_BYTES, redact_query
from outboxkit.transports.guarded import GuardedTransport
from outboxkit.transports.http import HttpTransport
from outboxkit.transports.signing import SigningTransport, WebhookSecrets
from outboxkit.url_guard import UrlGuard
from tests.support.receiver import Receiver, Reply
from tests.unit.test_http_transport import KEY, URL, router  # noqa: F401  (the respx fixture)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def headers_of(result) -> dict[str, str]:
    return dict(result.exchange.request_headers)


def test_method_url_headers_body_hash_and_the_answer_are_kept(router):
    router.post(URL).respond(
        503,
        headers={"Content-Type": "text/plain", "Retry-After": "30", "X-Request-Id": "req-7", "X-Internal": "no"},
        content=b"try later",
    )
    delivery = Delivery(url=URL, json={"amount": 5}, headers={"X-Tenant": "acme"})
    with HttpTransport(trust_env=False) as transport:
        result = transport.send(delivery, idempotency_key=KEY, timeout=10.0)

    exchange = result.exchange
    body = json.dumps({"amount": 5}, separators=(",", ":")).encode()
    assert (exchange.method, exchange.url) == ("POST", URL)
    assert headers_of(result)["X-Tenant"] == "acme"
    assert headers_of(result)["Idempotency-Key"] == KEY
    assert exchange.body_size == len(delivery.body()) and exchange.body == delivery.body()
    assert exchange.body_sha256 == hashlib.sha256(delivery.body()).hexdigest()
    assert delivery.body() == body
    assert exchange.status == 503
    assert dict(exchange.response_headers) == {
        "Content-Type": "text/plain", "Content-Length": "9", "Retry-After": "30", "X-Request-Id": "req-7"
    }
    assert exchange.response_excerpt == b"try later" and exchange.response_size == 9


def test_authorization_credentials_and_the_webhook_signature_are_redacted(router):
    route = router.post(URL).respond(200)
    delivery = Delivery(
        url=URL, json={}, headers={"X-Api-Key": "k-123", "X-Partner-Token": "t-456", "Cookie": "sid=1", "X-Kind": "grant"}
    )
    with HttpTransport(trust_env=False, headers={"Authorization": "Bearer s3cret"}) as http:
        result = SigningTransport(http, WebhookSecrets([SECRET])).send(delivery, idempotency_key=KEY, timeout=10.0)

    sent = route.calls.last.request.headers
    assert sent["Authorization"] == "Bearer s3cret" and sent["webhook-signature"].startswith("v1,")  # sent as they are
    shown = headers_of(result)
    assert shown["Authorization"] == "[redacted]"
    assert shown["webhook-signature"] == "[redacted]"
    assert shown["X-Api-Key"] == shown["X-Partner-Token"] == shown["Cookie"] == "[redacted]"
    assert shown["X-Kind"] == "grant" and shown["webhook-id"] == KEY and shown["Idempotency-Key"] == KEY
    assert shown["webhook-timestamp"].isdigit()
    everything = json.dumps([result.exchange.url, result.exchange.request_headers])
    assert "s3cret" not in everything and "k-123" not in everything and sent["webhook-signature"] not in everything


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://receiver.test/hook?token=abc&page=2", "http://receiver.test/hook?token=[redacted]&page=2"),
        ("http://receiver.test/hook?sig=abc&api_key=k", "http://receiver.test/hook?sig=[redacted]&api_key=[redacted]"),
        ("http://user:pw@receiver.test/hook", "http://***@receiver.test/hook"),
        ("http://receiver.test/hook?page=2&q=a+b", "http://receiver.test/hook?page=2&q=a+b"),
    ],
)
def test_query_string_secrets_and_user_information_are_redacted(url, shown):
    assert redact_query(url) == shown


def test_the_url_sent_is_shown_redacted(router):
    router.post(url__startswith="http://receiver.test/hook").respond(204)
    with HttpTransport(trust_env=False) as transport:
        result = transport.send(Delivery(url="http://receiver.test/hook?signature=xyz", json={}), idempotency_key=KEY, timeout=5)
    assert result.exchange.url == "http://receiver.test/hook?signature=[redacted]"


def test_a_failed_connection_keeps_what_was_sent_and_no_answer(router):
    import httpx

    router.post(URL).mock(side_effect=httpx.ConnectError("refused"))
    with HttpTransport(trust_env=False) as transport:
        result = transport.send(Delivery(url=URL, json={"n": 1}), idempotency_key=KEY, timeout=5)
    assert result.failure is FailureKind.CONNECTION
    assert result.exchange.method == "POST" and result.exchange.status is None
    assert response_json(result.exchange) is None
    assert json.loads(request_json(result.exchange, 0))["body_size"] == len(b'{"n":1}')


def test_what_is_kept_is_bounded(router):
    router.post(URL).respond(200, content=b"x" * (RESPONSE_EXCERPT_BYTES * 5))
    headers = {f"X-H{index}": "v" * 2000 for index in range(MAX_HEADERS + 10)}
    with HttpTransport(trust_env=False) as transport:
        result = transport.send(Delivery(url=URL, json={}, headers=headers), idempotency_key=KEY, timeout=5)
    assert len(result.exchange.request_headers) == MAX_HEADERS
    assert max(len(value) for _, value in result.exchange.request_headers) <= 500
    assert len(result.exchange.response_excerpt) == RESPONSE_EXCERPT_BYTES
    response = json.loads(response_json(result.exchange))
    assert response["body_truncated"] is True and response["body_size"] == RESPONSE_EXCERPT_BYTES * 5


def test_the_body_is_stored_only_up_to_the_setting_and_off_by_default(router):
    router.post(URL).respond(200)
    with HttpTransport(trust_env=False) as transport:
        result = transport.send(Delivery(url=URL, json={"text": "a" * 100}), idempotency_key=KEY, timeout=5)
    off = json.loads(request_json(result.exchange, 0))
    assert off["body"] is None and off["body_truncated"] is False and off["body_size"] == result.exchange.body_size
    some = json.loads(request_json(result.exchange, 10))
    assert some["body"] == '{"text":"a' and some["body_truncated"] is True
    whole = json.loads(request_json(result.exchange, 65_536))
    assert whole["body"] == result.exchange.body.decode() and whole["body_truncated"] is False


def test_a_guarded_send_redacts_every_header_filled_from_a_secret_whatever_its_name():
    with Receiver() as receiver, HttpTransport(trust_env=False) as http:
        receiver.respond = lambda request: Reply(status=500, body=b"internal details")
        guarded = GuardedTransport(
            http, guard=UrlGuard.from_entries(["127.0.0.1/32"]), secrets={"partner": "p-789"}, error_body_chars=0
        )
        delivery = Delivery(url=receiver.url + "/hook", json={}, headers={"X-Partner": "secret:partner", "X-Plain": "yes"})
        result = guarded.send(delivery, idempotency_key=KEY, timeout=10.0)
        assert receiver.requests[0].headers["X-Partner"] == "p-789"
    shown = headers_of(result)
    assert shown["X-Partner"] == "[redacted]" and shown["X-Plain"] == "yes"
    assert "p-789" not in json.dumps(result.exchange.request_headers)
    assert result.exchange.status == 500 and result.exchange.response_excerpt == b""  # as last_error shows: nothing
