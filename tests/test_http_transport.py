"""HttpTransport: what goes on the wire and how failures map to outcomes.

Unit tests mock the network with respx; the last tests use the real
receiver on 127.0.0.1 for a real refused connection and a real reset.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
import respx

from outboxkit.http_transport import ERROR_BODY_LIMIT, HttpTransport
from outboxkit.policy import FailureKind
from outboxkit.transport import Delivery
from tests.support.receiver import Receiver, Reply

URL = "http://receiver.test/events"
KEY = "8a0c1a52-5f1b-4f7e-9d59-0c2f1d3e4b5a"


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


@pytest.fixture
def transport() -> Iterator[HttpTransport]:
    with HttpTransport() as transport:
        yield transport


def send(transport: HttpTransport, delivery: Delivery | None = None, *, timeout: float = 10.0):
    return transport.send(delivery or Delivery(url=URL, json={"n": 1}), idempotency_key=KEY, timeout=timeout)


# -- the request -----------------------------------------------------------------


def test_sends_from_one_thread_reuse_one_connection_pool_and_close_it(router, monkeypatch):
    created: list[httpx.HTTPTransport] = []

    class CountingPool(httpx.HTTPTransport):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(httpx, "HTTPTransport", CountingPool)
    route = router.post(URL).respond(200)
    with HttpTransport() as transport:
        before = len(created)  # the transport's own client builds one at start
        for _ in range(3):
            assert send(transport).status_code == 200
        assert len(created) - before <= 1  # this thread's pool, made once and reused
    assert route.call_count == 3
    assert transport.client.is_closed


def test_a_client_passed_in_is_used_and_left_open(router):
    route = router.post(URL).respond(204)
    client = httpx.Client()
    try:
        with HttpTransport(client=client) as transport:
            assert transport.client is client
            assert send(transport).status_code == 204
        assert route.call_count == 1
        assert not client.is_closed
    finally:
        client.close()


def test_json_body_and_content_type(router, transport):
    route = router.post(URL).respond(200)
    result = send(transport, Delivery(url=URL, json={"grant": 7, "note": "café", "items": [1, 2]}))
    assert result.succeeded
    request = route.calls.last.request
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {"grant": 7, "note": "café", "items": [1, 2]}


def test_no_json_sends_no_body_and_no_content_type(router, transport):
    route = router.delete(URL).respond(200)
    assert send(transport, Delivery(url=URL, method="delete")).succeeded
    request = route.calls.last.request
    assert request.method == "DELETE"
    assert request.content == b""
    assert "Content-Type" not in request.headers


def test_a_content_type_from_the_application_is_kept(router, transport):
    route = router.post(URL).respond(200)
    send(transport, Delivery(url=URL, json={"a": 1}, headers={"Content-Type": "application/vnd.grant+json"}))
    assert route.calls.last.request.headers["Content-Type"] == "application/vnd.grant+json"


def test_idempotency_key_is_the_given_key_on_every_attempt(router, transport):
    route = router.post(URL).mock(side_effect=[httpx.Response(503), httpx.Response(500), httpx.Response(200)])
    delivery = Delivery(url=URL, json={"n": 1})
    results = [send(transport, delivery) for _ in range(3)]
    assert [result.status_code for result in results] == [503, 500, 200]
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == [KEY] * 3


def test_user_headers_and_transport_headers_are_sent(router):
    route = router.put(URL).respond(200)
    with HttpTransport(headers={"Authorization": "Bearer s3cret"}, user_agent="credits/1.0") as transport:
        send(transport, Delivery(url=URL, method="PUT", json={}, headers={"X-Kind": "grant", "X-Tenant": "acme"}))
    headers = route.calls.last.request.headers
    assert headers["X-Kind"] == "grant"
    assert headers["X-Tenant"] == "acme"
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["User-Agent"] == "credits/1.0"
    assert headers["Idempotency-Key"] == KEY


@pytest.mark.parametrize(
    ("timeout", "connect"),
    [(30.0, 5.0), (2.0, 2.0)],
)
def test_the_send_timeout_bounds_the_read_and_the_connect(router, transport, timeout, connect):
    route = router.post(URL).respond(200)
    send(transport, timeout=timeout)
    assert route.calls.last.request.extensions["timeout"] == {
        "connect": connect,
        "read": timeout,
        "write": timeout,
        "pool": timeout,
    }


def test_redirects_are_not_followed(router, transport):
    route = router.post(URL).respond(307, headers={"Location": "http://elsewhere.test/"})
    result = send(transport)
    assert result.status_code == 307
    assert route.call_count == 1


# -- outcomes --------------------------------------------------------------------


@pytest.mark.parametrize("status_code", [200, 201, 202, 204])
def test_2xx_is_a_success_without_error(router, transport, status_code):
    router.post(URL).respond(status_code, text="ok")
    result = send(transport)
    assert result.succeeded
    assert result.status_code == status_code
    assert result.error is None
    assert result.failure is None


@pytest.mark.parametrize(
    "exception",
    [httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout],
)
def test_timeouts_map_to_timeout(router, transport, exception):
    router.post(URL).mock(side_effect=exception("timed out"))
    result = send(transport)
    assert result.failure is FailureKind.TIMEOUT
    assert result.status_code is None
    assert exception.__name__ in result.error


@pytest.mark.parametrize(
    "exception",
    [httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError],
    ids=["connect-refused", "read-reset", "write-reset", "server-disconnected"],
)
def test_connection_errors_map_to_connection(router, transport, exception):
    router.post(URL).mock(side_effect=exception("[Errno 104] Connection reset by peer"))
    result = send(transport)
    assert result.failure is FailureKind.CONNECTION
    assert result.status_code is None
    assert "Connection reset by peer" in result.error


def test_other_httpx_errors_map_to_transport(router, transport):
    router.post(URL).mock(side_effect=httpx.ProxyError("proxy said no"))
    result = send(transport)
    assert result.failure is FailureKind.TRANSPORT
    assert "proxy said no" in result.error


def test_a_url_httpx_rejects_is_a_transport_failure_not_an_exception(router, transport):
    # A zero-width space passes Delivery's checks but not httpx's IDNA parser,
    # which raises InvalidURL (not an httpx.HTTPError) before any network I/O.
    result = send(transport, Delivery(url="http://a\u200b.test/events"))
    assert result.failure is FailureKind.TRANSPORT
    assert "InvalidURL" in result.error


def test_non_2xx_keeps_status_error_excerpt_and_retry_after(router, transport):
    router.post(URL).respond(503, text="down for maintenance", headers={"Retry-After": "120"})
    result = send(transport)
    assert result.status_code == 503
    assert result.failure is None
    assert not result.succeeded
    assert result.error == "HTTP 503: down for maintenance"
    assert result.retry_after == "120"


def test_a_long_error_body_is_truncated(router, transport):
    router.post(URL).respond(422, text="x" * 10_000)
    result = send(transport)
    assert result.status_code == 422
    assert result.error == "HTTP 422: " + "x" * ERROR_BODY_LIMIT


def test_an_empty_error_body_gives_the_status_alone(router, transport):
    router.post(URL).respond(500)
    result = send(transport)
    assert result.error == "HTTP 500"
    assert result.retry_after is None


def test_retry_after_as_an_http_date_is_passed_through(router, transport):
    router.post(URL).respond(429, headers={"Retry-After": "Tue, 01 Jan 2030 12:10:00 GMT"})
    assert send(transport).retry_after == "Tue, 01 Jan 2030 12:10:00 GMT"


# -- Delivery validation ---------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "receiver.test/events",
        "ftp://receiver.test/events",
        "http://",
        "http:///path-only",
        "http://receiver .test/",
        "http://receiver.test/a b",
        "http://receiver.test:99999/",
        "http://[::1/",
        "",
        None,
        b"http://receiver.test/",
    ],
)
def test_delivery_refuses_a_bad_url(url):
    with pytest.raises(ValueError, match="Delivery.url must be an absolute http"):
        Delivery(url=url)


@pytest.mark.parametrize("method", ["CONNECT", "TRACE", "FETCH", "", None, 1])
def test_delivery_refuses_a_bad_method(method):
    with pytest.raises(ValueError, match="Delivery.method must be one of"):
        Delivery(url=URL, method=method)


def test_delivery_upper_cases_the_method():
    assert Delivery(url=URL, method="patch").method == "PATCH"


@pytest.mark.parametrize("name", ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"])
def test_delivery_refuses_an_idempotency_key_header(name):
    with pytest.raises(ValueError, match="Idempotency-Key is set by outboxkit"):
        Delivery(url=URL, headers={name: "mine"})


@pytest.mark.parametrize(
    "headers",
    [{"X-Count": 1}, {"X-Flag": None}, {1: "one"}, {"X-Bytes": b"raw"}],
)
def test_delivery_refuses_non_str_headers(headers):
    with pytest.raises(ValueError, match="must map str to str"):
        Delivery(url=URL, headers=headers)


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Injected": "a\r\nEvil: 1"},
        {"X-Trailing": "value\n"},
        {"X-Trailing\n": "value"},
        {"Bad Name": "v"},
        {"": "v"},
        {"X-Accent": "café"},
    ],
)
def test_delivery_refuses_headers_http_cannot_carry(headers):
    with pytest.raises(ValueError, match="invalid HTTP header"):
        Delivery(url=URL, headers=headers)


def test_delivery_refuses_headers_that_are_not_a_mapping():
    with pytest.raises(ValueError, match="must be a mapping"):
        Delivery(url=URL, headers=[("X-Kind", "grant")])


def test_delivery_keeps_its_own_copy_of_the_headers():
    headers = {"X-Kind": "grant"}
    delivery = Delivery(url=URL, headers=headers)
    headers["Idempotency-Key"] = "sneaked in"
    assert delivery.headers == {"X-Kind": "grant"}


@pytest.mark.parametrize("payload", [{"amount": float("nan")}, {"amount": float("inf")}])
def test_delivery_refuses_json_it_cannot_encode(payload):
    with pytest.raises(ValueError, match="cannot be encoded as JSON"):
        Delivery(url=URL, json=payload)


def test_delivery_body_is_compact_json():
    assert Delivery(url=URL, json={"a": [1, 2], "b": "c"}).body() == b'{"a":[1,2],"b":"c"}'


# -- the real network, on 127.0.0.1 ---------------------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_real_refused_connection_maps_to_connection(transport):
    result = send(transport, Delivery(url=f"http://127.0.0.1:{closed_port()}/events", json={"n": 1}))
    assert result.failure is FailureKind.CONNECTION
    assert result.status_code is None
    assert "ConnectError" in result.error


def test_a_real_reset_maps_to_connection(transport, receiver: Receiver):
    receiver.respond = lambda request: Reply(reset=True)
    result = send(transport, Delivery(url=f"{receiver.url}/events", json={"n": 1}))
    assert result.failure is FailureKind.CONNECTION
    assert result.status_code is None
    assert receiver.keys() == [KEY]


def test_a_real_receiver_sees_the_key_body_and_headers(transport, receiver: Receiver):
    receiver.respond = lambda request: Reply(status=503, headers={"Retry-After": "30"}, body=b"busy")
    delivery = Delivery(url=f"{receiver.url}/events", json={"n": 1}, headers={"X-Kind": "grant"})
    first = send(transport, delivery)
    receiver.respond = lambda request: Reply(status=201)
    second = send(transport, delivery)
    assert (first.status_code, first.error, first.retry_after) == (503, "HTTP 503: busy", "30")
    assert second.succeeded
    assert receiver.keys() == [KEY, KEY]
    assert [request.body for request in receiver.requests] == [{"n": 1}, {"n": 1}]
    assert receiver.requests[0].headers["X-Kind"] == "grant"


def test_a_real_receiver_that_does_not_answer_in_time_maps_to_timeout(transport, receiver: Receiver):
    receiver.respond = lambda request: Reply(hang=True)  # answers only when the fixture stops it
    result = send(transport, Delivery(url=f"{receiver.url}/events", json={"n": 1}), timeout=0.3)
    assert result.failure is FailureKind.TIMEOUT
    assert "ReadTimeout" in result.error
    assert receiver.keys() == [KEY]
