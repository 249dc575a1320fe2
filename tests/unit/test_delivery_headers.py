"""Headers that frame or route a request are the kit's, never a delivery's: each is refused where headers are accepted.

A ``Delivery``, an ``HttpTransport``'s own headers and a schedule's HTTP
target refuse ``Transfer-Encoding``, ``Content-Length``, ``Connection``,
``Upgrade``, ``Host`` and the other hop-by-hop headers (``Keep-Alive``,
``TE``, ``Trailer``, ``Proxy-*``), in any letter case, with the header named.
tests/integration/test_request_smuggling.py shows a real keep-alive receiver
gets nothing smuggled.
"""

from __future__ import annotations

import pytest

from outboxkit.errors import ConfigurationError, InvalidDeliveryError, InvalidScheduleError
from outboxkit.schedules.definitions import HttpTarget
from outboxkit.transports.base import Delivery
from outboxkit.transports.http import HttpTransport

URL = "http://127.0.0.1:1/hook"
FRAMING = [
    "Transfer-Encoding", "transfer-encoding", "Content-Length", "CONNECTION", "Upgrade", "Host", "Keep-Alive", "TE",
    "Trailer", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "proxy-anything",
]


@pytest.mark.parametrize("name", FRAMING)
def test_a_delivery_refuses_a_header_that_frames_or_routes_the_request(name):
    with pytest.raises(InvalidDeliveryError, match=f"may not set {name!r}"):
        Delivery(url=URL, json={"n": 1}, headers={name: "chunked"})


@pytest.mark.parametrize("name", ["Transfer-Encoding", "Content-Length", "Connection", "Host", "Proxy-Authorization"])
def test_a_schedules_http_target_refuses_it_with_the_field_named(name):
    with pytest.raises(InvalidScheduleError, match=f"^target.headers: .*may not set {name!r}"):
        HttpTarget(url=URL, outbox="scheduled-calls", headers={name: "0"})


@pytest.mark.parametrize("name", ["Transfer-Encoding", "Connection", "Host"])
def test_an_http_transports_own_headers_refuse_it(name):
    with pytest.raises(ConfigurationError, match=f"may not set {name!r}"):
        HttpTransport(headers={name: "x"})


def test_ordinary_headers_are_still_accepted():
    delivery = Delivery(url=URL, json={}, headers={"Content-Type": "application/vnd.x+json", "X-Connection-Id": "7"})
    assert delivery.headers == {"Content-Type": "application/vnd.x+json", "X-Connection-Id": "7"}
