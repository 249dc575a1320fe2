"""The HTTP transport's direct path sends what the client path sent, and an environment proxy is still honoured.

The drain's fast paths against the database are in tests/integration/test_drain_fast_paths.py.
"""

from __future__ import annotations

from outboxkit import Delivery, HttpTransport


def test_the_direct_path_sends_the_default_headers_the_key_and_one_content_type(receiver):
    with HttpTransport(headers={"X-Service": "billing"}) as transport:
        plain = transport.send(Delivery(url=f"{receiver.url}/a", json={"n": 1}), idempotency_key="key-1", timeout=5)
        typed = transport.send(
            Delivery(url=f"{receiver.url}/b", json={"n": 2}, headers={"content-type": "application/merge-patch+json"}),
            idempotency_key="key-2",
            timeout=5,
        )
    assert plain.succeeded and typed.succeeded
    first, second = receiver.requests
    assert (first.key, first.body) == ("key-1", {"n": 1})
    assert first.headers["User-Agent"] == "outboxkit" and first.headers["X-Service"] == "billing"
    assert first.headers["Content-Type"] == "application/json"
    assert [value for name, value in second.headers.items() if name.lower() == "content-type"] == ["application/merge-patch+json"]


def test_an_environment_proxy_is_honoured(receiver, monkeypatch):
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", receiver.url)  # the receiver plays the proxy
    with HttpTransport() as transport:
        result = transport.send(Delivery(url="http://billing.invalid/grants"), idempotency_key="key-p", timeout=5)
    assert result.succeeded
    (request,) = receiver.requests
    assert request.path == "http://billing.invalid/grants" and request.key == "key-p"
