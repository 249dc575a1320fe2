"""HttpTransport: what goes on the wire and how failures map to outcomes.

Unit tests mock the network with respx; the last tests use the real
receiver on 127.0.0.1 for a real refused connection, a real reset, answers
and uploads that drip past the send's deadline, a connect that gets no
answer, a name lookup that hangs, and proxies.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpcore
import httpx
import pytest
import respx

from outboxkit.errors import ConfigurationError
from outboxkit.policy import FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.http import ERROR_BODY_LIMIT, HttpTransport
from tests.support.receiver import Receiver, Reply, self_signed_certificate

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
    created: list[httpcore.ConnectionPool] = []

    class CountingPool(httpcore.ConnectionPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(httpcore, "ConnectionPool", CountingPool)
    route = router.post(URL).respond(200)
    with HttpTransport() as transport:
        for _ in range(3):
            assert send(transport).status_code == 200
        assert len(created) == 1  # this thread's pool, made once and reused
    assert route.call_count == 3
    after_close = send(transport)
    assert after_close.failure is FailureKind.TRANSPORT
    assert "the transport is closed" in after_close.error


def test_respx_sees_the_sends_on_the_deadline_path(router, transport):
    route = router.post(URL).respond(202)
    assert send(transport, timeout=1.0).status_code == 202
    (call,) = route.calls
    assert call.request.headers["Idempotency-Key"] == KEY
    assert call.request.headers["Host"] == "receiver.test"


def test_a_client_argument_is_refused_with_what_to_use_instead():
    with pytest.raises(ConfigurationError, match=r"client=\.\.\.\) was removed.*ssl_context=.*proxy="):
        HttpTransport(client=httpx.Client())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"ssl_context": "/etc/ssl/cert.pem"}, "must be an ssl.SSLContext"),
        ({"max_connections": 0}, "max_connections"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"proxy": "socks5://proxy.test:1080"}, "only http:// proxies are supported"),
        ({"proxy": "https://proxy.test:3128"}, "only http:// proxies are supported"),
        ({"verify": False}, "unexpected keyword argument 'verify'"),
        ({"headers": {"X-Count": 1}}, "must map str to str"),
        ({"headers": {"Authorization": "Bearer caf\u00e9"}}, "'Authorization' must be ASCII"),
        ({"headers": {"X-Evil": "a\r\nInjected: 1"}}, "without line breaks"),
        ({"user_agent": None}, "must map str to str"),
    ],
)
def test_bad_options_are_refused_at_start_up(arguments, message):
    with pytest.raises(ConfigurationError, match=message):
        HttpTransport(**arguments)


def test_a_bad_proxy_url_is_refused_without_echoing_its_password():
    with pytest.raises(ConfigurationError) as caught:
        HttpTransport(proxy="https://user:hunter2@proxy.test:3128")
    assert "hunter2" not in str(caught.value)


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
        ["http://receiver.test/"],  # unhashable: refused, not a TypeError from the check's cache
    ],
)
def test_delivery_refuses_a_bad_url(url):
    with pytest.raises(ValueError, match="Delivery.url must be an absolute http\\(s\\) URL with a host, or a broker"):
        Delivery(url=url)


def test_a_url_checked_before_gets_the_same_answer_again():
    # The check is remembered per URL (it runs for every row built): a refused URL stays refused.
    for _ in range(2):
        with pytest.raises(ValueError, match="Delivery.url must be an absolute http\\(s\\) URL with a host, or a broker"):
            Delivery(url="http://receiver.test/a b")
        assert Delivery(url="http://receiver.test/a%20b").url == "http://receiver.test/a%20b"


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
    assert result.error == "timeout: no complete answer within 0.3 s (deadline; ReadTimeout while reading the answer)"
    assert receiver.keys() == [KEY]


# -- the deadline: one total budget per send, on 127.0.0.1 ----------------------
#
# Each receiver below would take tens of seconds to finish; per-operation
# timeouts never fire because every wait ends in well under a second.  A send
# must end at its deadline: not before it, and long before the receiver would
# have finished (the upper bounds leave room for a busy machine).

DEADLINE = 1.0
LATEST_END = 6.0  # far below the 12-30 s the receivers below take, with room for a stalled test thread


def timed_send(transport: HttpTransport, delivery: Delivery, *, timeout: float = DEADLINE):
    started = time.monotonic()
    result = send(transport, delivery, timeout=timeout)
    return result, time.monotonic() - started


@pytest.mark.parametrize("part", ["all", "head", "body"])
def test_an_answer_dripped_past_the_deadline_ends_the_send_at_the_deadline(transport, receiver: Receiver, part):
    # One byte every 0.1 s of a ~300-byte part: about 30 s to answer.
    receiver.respond = lambda request: Reply(
        headers={"X-Padding": "p" * 250}, body=b"x" * 300, drip=1, drip_pause=0.1, drip_part=part
    )
    delivery = Delivery(url=f"{receiver.url}/events", json={"n": 1})
    result, elapsed = timed_send(transport, delivery)
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 1 s (deadline; ReadTimeout while reading the answer)"
    assert DEADLINE <= elapsed < LATEST_END
    # The same thread's pool is not poisoned: the next send gets a fresh connection and its answer.
    receiver.respond = lambda request: Reply(status=201)
    again, elapsed = timed_send(transport, delivery)
    assert again.status_code == 201 and again.succeeded
    assert elapsed < LATEST_END
    assert receiver.keys() == [KEY, KEY]


def test_an_upload_the_receiver_reads_slowly_ends_at_the_deadline(transport, receiver: Receiver):
    # 32 MB, far more than the loopback socket buffers hold, read 128 kB every 50 ms: each write
    # makes progress well within a second (so a per-operation timeout never fires), but the
    # upload takes over 12 s in all.  A longer deadline than the other tests': encoding 32 MB
    # of JSON at the start of the send takes a visible share of it on a busy machine.
    receiver.read_pace = (131_072, 0.05)
    delivery = Delivery(url=f"{receiver.url}/events", json={"blob": "x" * 32_000_000})
    result, elapsed = timed_send(transport, delivery, timeout=2.0)
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 2 s (deadline; WriteTimeout while sending the request)"
    assert 2.0 <= elapsed < 2.0 + LATEST_END


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port on 127.0.0.1 whose listen queue is full: a connect to it gets no answer at all."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # never accepted; Linux then drops further SYNs
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            fillers.append(filler)
            filler.settimeout(0.5)
            try:
                filler.connect(listener.getsockname())
            except TimeoutError:
                break
        else:
            pytest.skip("the listen queue never filled here, so no connect can be made to hang")
        yield listener.getsockname()[1]
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_connect_that_gets_no_answer_ends_at_the_deadline(transport, unanswered_port):
    result, elapsed = timed_send(transport, Delivery(url=f"http://127.0.0.1:{unanswered_port}/events"))
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 1 s (deadline; ConnectTimeout while connecting)"
    assert DEADLINE <= elapsed < LATEST_END


def test_connect_timeout_ends_a_connect_before_the_deadline(unanswered_port):
    with HttpTransport(connect_timeout=0.5) as transport:
        result, elapsed = timed_send(transport, Delivery(url=f"http://127.0.0.1:{unanswered_port}/events"), timeout=20.0)
    assert result.failure is FailureKind.TIMEOUT
    assert result.error.startswith("timeout: no connection within connect_timeout 0.5 s (ConnectTimeout")
    assert 0.5 <= elapsed < LATEST_END


@pytest.fixture
def hanging_lookups(monkeypatch) -> Iterator[list[str]]:
    """``socket.getaddrinfo`` blocks for names ending in ``.hangs.test`` and fails for ``.fails.test``."""
    release = threading.Event()
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".hangs.test"):
            asked.append(host)
            release.wait(60)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if isinstance(host, str) and host.endswith(".fails.test"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        yield asked
    finally:
        release.set()  # let the lookup threads finish


def test_a_name_lookup_that_hangs_ends_at_the_deadline(transport, hanging_lookups):
    result, elapsed = timed_send(transport, Delivery(url="http://receiver.hangs.test/events"))
    assert hanging_lookups == ["receiver.hangs.test"]
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 1 s (deadline; ConnectTimeout while connecting)"
    assert DEADLINE <= elapsed < LATEST_END


def test_a_name_that_does_not_resolve_is_a_connection_failure(transport, hanging_lookups):
    result = send(transport, Delivery(url="http://receiver.fails.test/events"))
    assert result.failure is FailureKind.CONNECTION
    assert "name lookup of 'receiver.fails.test' failed" in result.error


def test_an_address_that_gets_no_answer_leaves_time_for_the_next(monkeypatch, unanswered_port, receiver: Receiver):
    # A name with two addresses, the first black-holed (as a broken IPv6 route often is).
    real = socket.getaddrinfo
    addresses = [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))
        for port in (unanswered_port, receiver.port)
    ]
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda host, *args, **kwargs: addresses if host == "twofold.test" else real(host, *args, **kwargs)
    )
    with HttpTransport() as transport:
        result, elapsed = timed_send(transport, Delivery(url=f"http://twofold.test:{receiver.port}/events"), timeout=2.0)
    assert result.succeeded  # the first address had half of the time, the second answered
    assert receiver.keys() == [KEY]
    assert 1.0 <= elapsed < 2.0 + LATEST_END


# -- proxies ---------------------------------------------------------------------


@pytest.fixture
def no_proxy_environment(monkeypatch):
    for scheme in ("HTTP", "HTTPS", "ALL", "NO"):
        monkeypatch.delenv(f"{scheme}_PROXY", raising=False)
        monkeypatch.delenv(f"{scheme.lower()}_proxy", raising=False)
    return monkeypatch


def test_an_explicit_proxy_carries_every_send_with_its_credentials(no_proxy_environment, receiver: Receiver):
    proxy = receiver.url.replace("http://", "http://outbox:s3cret@")  # the receiver plays the proxy
    with HttpTransport(proxy=proxy) as transport:
        result = send(transport, Delivery(url="http://billing.invalid/grants", json={"n": 1}))
    assert result.succeeded
    (request,) = receiver.requests
    assert request.path == "http://billing.invalid/grants" and request.key == KEY
    assert request.headers["Proxy-Authorization"] == "Basic b3V0Ym94OnMzY3JldA=="


def test_no_proxy_sends_a_listed_host_directly(no_proxy_environment, receiver: Receiver):
    no_proxy_environment.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")  # nothing listens there
    no_proxy_environment.setenv("NO_PROXY", "localhost,127.0.0.1")
    with HttpTransport() as transport:
        result = send(transport, Delivery(url=f"{receiver.url}/events"))
    assert result.succeeded
    assert receiver.requests[0].path == "/events"


def test_trust_env_false_ignores_the_environment_proxy(no_proxy_environment, receiver: Receiver):
    no_proxy_environment.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
    with HttpTransport(trust_env=False) as transport:
        assert send(transport, Delivery(url=f"{receiver.url}/events")).succeeded


def test_an_environment_proxy_the_transport_cannot_use_is_refused_at_start_up(no_proxy_environment):
    no_proxy_environment.setenv("HTTPS_PROXY", "socks5://proxy.test:1080")
    with pytest.raises(ConfigurationError, match=r"environment's proxy.*only http:// proxies.*trust_env=False"):
        HttpTransport()


# -- TLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Path:
    """A self-signed certificate for 127.0.0.1; its key is beside it."""
    return self_signed_certificate(
        tmp_path_factory.mktemp("tls"), common_name="outboxkit test receiver", alt_name="IP:127.0.0.1"
    )


@pytest.fixture
def tls_receiver(certificate: Path) -> Iterator[Receiver]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, certificate.with_name("key.pem"))
    with Receiver(tls=context) as receiver:
        yield receiver


def test_ssl_context_trusts_a_private_ca(tls_receiver: Receiver, certificate: Path):
    with HttpTransport(ssl_context=ssl.create_default_context(cafile=str(certificate))) as transport:
        result = send(transport, Delivery(url=f"{tls_receiver.url}/events", json={"n": 1}))
    assert result.succeeded
    assert tls_receiver.keys() == [KEY]


def test_the_default_context_refuses_an_unknown_certificate(transport, tls_receiver: Receiver):
    result = send(transport, Delivery(url=f"{tls_receiver.url}/events", json={"n": 1}))
    assert result.failure is FailureKind.CONNECTION
    assert "CERTIFICATE_VERIFY_FAILED" in result.error
    assert tls_receiver.keys() == []


def test_an_answer_dripped_over_tls_ends_at_the_deadline(tls_receiver: Receiver, certificate: Path):
    tls_receiver.respond = lambda request: Reply(body=b"x" * 300, drip=1, drip_pause=0.1)
    with HttpTransport(ssl_context=ssl.create_default_context(cafile=str(certificate))) as transport:
        result, elapsed = timed_send(transport, Delivery(url=f"{tls_receiver.url}/events", json={"n": 1}))
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 1 s (deadline; ReadTimeout while reading the answer)"
    assert DEADLINE <= elapsed < LATEST_END


def test_a_tls_handshake_that_gets_no_answer_ends_at_the_deadline(transport):
    # The kernel completes the TCP handshake into the listen queue; nothing ever reads the ClientHello.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        result, elapsed = timed_send(transport, Delivery(url=f"https://127.0.0.1:{port}/events"))
    assert result.failure is FailureKind.TIMEOUT
    assert result.error == "timeout: no complete answer within 1 s (deadline; ConnectTimeout while connecting)"
    assert DEADLINE <= elapsed < LATEST_END
