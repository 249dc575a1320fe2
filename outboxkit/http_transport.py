"""HTTP delivery on httpx.

One connection pool is shared by every delivery (and every thread) of a
transport, so connections are pooled and reused.  Each attempt carries the
row's ``Idempotency-Key`` header.  Errors are mapped to outcomes, never
raised: a timeout is ``timeout``, a refused or reset connection is
``connection``, anything else inside httpx is ``transport``.

Speed (measured in bench/drain_throughput.py, see docs/performance.md):
when the transport owns its client and the environment names no proxy, a
send goes straight to an ``httpx.HTTPTransport`` (httpx's public transport
API) instead of through ``Client.request``.  A delivery needs none of what
the client layer adds (redirects are not followed, there is no auth, no
cookies, no event hooks), and skipping it saves about a third of the CPU of
each send.  Each sending thread gets its own connection pool (sharing one TLS
context): one pool shared by sixteen threads spent a sixth of the drainer's
CPU handing its lock from thread to thread.  URLs are parsed once and
cached.  A client passed in by the application, or a proxy in the
environment, takes the full ``Client.request`` path, so its settings
(proxies, event hooks, auth) apply.
"""

from __future__ import annotations

import threading
import urllib.request
from functools import lru_cache

import httpx

from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transport import Delivery

__all__ = ["HttpTransport"]

# How much of a non-2xx response body is kept in last_error: enough to read
# the receiver's complaint, not enough to bloat the table.
ERROR_BODY_LIMIT = 500


class HttpTransport:
    """Delivers over HTTP(S) with a pooled ``httpx.Client``.

    ``connect_timeout`` bounds the TCP/TLS handshake; each send's ``timeout``
    (from the outbox's options) bounds the whole read.  Pass ``client`` to
    bring your own (proxies, mTLS, event hooks); the transport then does not
    close it.
    """

    def __init__(
        self,
        *,
        client: httpx.Client | None = None,
        connect_timeout: float = 5.0,
        max_connections: int = 100,
        headers: dict[str, str] | None = None,
        user_agent: str = "outboxkit",
    ) -> None:
        self._owns_client = client is None
        self._connect_timeout = connect_timeout
        self._default_headers = {"User-Agent": user_agent, **(headers or {})}
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._thread_pools = threading.local()
        self._pools: list[httpx.HTTPTransport] = []
        self._pools_lock = threading.Lock()
        self._closed = False
        # The direct path: only for our own client, and only when no proxy is configured.
        self._direct = client is None and not urllib.request.getproxies()
        if self._direct:
            self._tls = httpx.create_ssl_context()
            shared = httpx.HTTPTransport(verify=self._tls, limits=self._limits)
            client = httpx.Client(transport=shared, headers=self._default_headers, follow_redirects=False)
        elif client is None:  # no transport= here: a client given one ignores the environment's proxies
            client = httpx.Client(limits=self._limits, headers=self._default_headers, follow_redirects=False)
        self._client = client

    @property
    def client(self) -> httpx.Client:
        return self._client

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        headers = dict(delivery.headers)
        present = {name.lower() for name in headers}
        if self._direct:  # the client would have added its default headers
            headers.update((name, value) for name, value in self._default_headers.items() if name.lower() not in present)
        headers["Idempotency-Key"] = idempotency_key
        body = delivery.body()
        if body is not None and "content-type" not in present:
            headers["Content-Type"] = "application/json"
        try:
            if self._direct:
                response = self._send_direct(delivery, headers, body, timeout)
            else:
                response = self._client.request(
                    delivery.method, delivery.url, content=body, headers=headers, timeout=self._timeout(timeout)
                )
        except httpx.TimeoutException as exc:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: {type(exc).__name__}: {exc}")
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {type(exc).__name__}: {exc}")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is not an HTTPError
            return AttemptResult(failure=FailureKind.TRANSPORT, error=f"{type(exc).__name__}: {exc}")
        if 200 <= response.status_code < 300:
            return AttemptResult(status_code=response.status_code)
        text = response.text[:ERROR_BODY_LIMIT] if response.content else ""
        return AttemptResult(
            status_code=response.status_code,
            error=f"HTTP {response.status_code}" + (f": {text}" if text else ""),
            retry_after=response.headers.get("Retry-After"),
        )

    def _send_direct(
        self, delivery: Delivery, headers: dict[str, str], body: bytes | None, timeout: float
    ) -> httpx.Response:
        request = httpx.Request(
            delivery.method,
            _parsed_url(delivery.url),
            content=body,
            headers=headers,
            extensions={"timeout": self._timeout(timeout).as_dict()},
        )
        response = self._pool_of_this_thread().handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def _pool_of_this_thread(self) -> httpx.HTTPTransport:
        pool: httpx.HTTPTransport | None = getattr(self._thread_pools, "pool", None)
        if pool is None:
            pool = httpx.HTTPTransport(verify=self._tls, limits=self._limits)
            with self._pools_lock:
                if self._closed:
                    pool.close()
                    raise httpx.TransportError("the transport is closed")
                self._pools.append(pool)
            self._thread_pools.pool = pool
        return pool

    def _timeout(self, timeout: float) -> httpx.Timeout:
        return _timeout(timeout, min(self._connect_timeout, timeout))

    def close(self) -> None:
        if self._owns_client:
            with self._pools_lock:
                self._closed = True
                pools, self._pools = self._pools, []
            for pool in pools:
                pool.close()
            self._client.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@lru_cache(maxsize=1024)
def _parsed_url(url: str) -> httpx.URL:
    # Parsing a URL is a visible share of a send's CPU, and an outbox sends to
    # few distinct URLs.  httpx.URL is immutable, so sharing one is safe.
    return httpx.URL(url)


@lru_cache(maxsize=64)
def _timeout(timeout: float, connect: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, connect=connect)
