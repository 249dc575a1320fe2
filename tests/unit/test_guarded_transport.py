"""``GuardedTransport``: a schedule's request is checked again at send time, sent to the checked address, never
redirected, and what it shows of an error answer is short and opt-in.

The receiver is the real one on 127.0.0.1; a refused send is shown never to
reach it (and, with respx, never to leave the process).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import respx

from outboxkit.policy import FailureKind, RetryPolicy
from outboxkit.transports.base import Delivery
from outboxkit.transports.guarded import GuardedTransport
from outboxkit.transports.http import HttpTransport
from outboxkit.url_guard import UrlGuard
from tests.support.receiver import Receiver, Reply, self_signed_certificate

KEY = "8a0c1a52-5f1b-4f7e-9d59-0c2f1d3e4b5a"
LOOPBACK_ALLOWED = UrlGuard.from_entries(["127.0.0.1/32"])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def http() -> Iterator[HttpTransport]:
    with HttpTransport(trust_env=False) as transport:
        yield transport


def send(transport: GuardedTransport, url: str):
    return transport.send(Delivery(url=url, json={"n": 1}), idempotency_key=KEY, timeout=10.0)


def test_a_loopback_url_is_refused_at_send_time_and_nothing_reaches_the_receiver(receiver, http):
    result = send(GuardedTransport(http, guard=UrlGuard()), receiver.url + "/ping")
    assert result.failure is FailureKind.REFUSED
    assert result.error.startswith("refused before sending: ") and "is a loopback address" in result.error
    assert (receiver.connections, receiver.requests) == (0, [])
    decision = RetryPolicy().decide(result, attempts=1, now=datetime(2030, 1, 1, tzinfo=timezone.utc))
    assert (decision.status, decision.reason) == ("stuck", "refused before sending; not retried")


def test_a_refused_send_makes_no_request_at_all():
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        route = router.route().respond(200)
        with HttpTransport(trust_env=False) as http:
            result = send(GuardedTransport(http, guard=UrlGuard()), "http://169.254.169.254/latest/meta-data/")
    assert result.failure is FailureKind.REFUSED and "link-local" in result.error
    assert route.call_count == 0


def test_an_allowed_url_is_sent(receiver, http):
    result = send(GuardedTransport(http, guard=LOOPBACK_ALLOWED), receiver.url + "/ping")
    assert result.status_code == 200
    [request] = receiver.requests
    assert request.path == "/ping" and request.body == {"n": 1}


def test_the_send_connects_to_the_checked_address_with_the_urls_own_host(receiver, http):
    # The system cannot resolve pinned.test: the request arrives only because the transport connects to the
    # address the guard checked, and never looks the name up again (no DNS rebinding between check and connect).
    port = receiver.url.rsplit(":", 1)[1]
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    guard = UrlGuard.from_entries(["127.0.0.1/32"], resolve=resolve)
    result = send(GuardedTransport(http, guard=guard), f"http://pinned.test:{port}/hook")
    assert result.status_code == 200, result.error
    [request] = receiver.requests
    assert request.headers["Host"] == f"pinned.test:{port}"
    assert lookups == ["pinned.test"]


def test_a_redirect_is_not_followed(receiver, http):
    receiver.respond = lambda request: Reply(status=302, headers={"Location": "http://169.254.169.254/"})
    result = send(GuardedTransport(http, guard=LOOPBACK_ALLOWED), receiver.url + "/moved")
    assert result.status_code == 302
    assert [request.path for request in receiver.requests] == ["/moved"]


def test_an_error_answers_body_is_left_out_unless_asked_for_and_then_short(receiver, http):
    receiver.respond = lambda request: Reply(status=500, body=b"FATAL: password authentication failed for user app")
    assert send(GuardedTransport(http, guard=LOOPBACK_ALLOWED), receiver.url).error == "HTTP 500"
    shown = send(GuardedTransport(http, guard=LOOPBACK_ALLOWED, error_body_chars=12), receiver.url).error
    assert shown == "HTTP 500: FATAL: passw"


@pytest.fixture(scope="module")
def named_certificate(tmp_path_factory) -> Path:
    """A self-signed certificate for the name pinned.test only (no IP address in it)."""
    return self_signed_certificate(tmp_path_factory.mktemp("named-tls"), common_name="pinned.test", alt_name="DNS:pinned.test")


@pytest.mark.parametrize(("name", "verified"), [("pinned.test", True), ("other.test", False)])
def test_over_tls_the_pinned_send_verifies_the_certificate_against_the_urls_name(named_certificate, name, verified):
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(named_certificate, named_certificate.with_name("key.pem"))
    guard = UrlGuard.from_entries(["127.0.0.1/32"], resolve=lambda host, port: ["127.0.0.1"])
    with Receiver(tls=server) as receiver, HttpTransport(
        ssl_context=ssl.create_default_context(cafile=str(named_certificate)), trust_env=False
    ) as http:
        port = receiver.url.rsplit(":", 1)[1]
        result = send(GuardedTransport(http, guard=guard), f"https://{name}:{port}/hook")
    if verified:
        assert result.status_code == 200, result.error
        assert receiver.requests[0].headers["Host"] == f"pinned.test:{port}"
    else:
        assert result.failure is FailureKind.CONNECTION and "CERTIFICATE_VERIFY_FAILED" in result.error
        assert receiver.requests == []
