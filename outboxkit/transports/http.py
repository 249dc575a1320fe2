"""HTTP delivery on httpcore, with a hard deadline per send.

Each attempt carries the row's ``Idempotency-Key`` header.  Each result
carries what was sent and what came back, redacted and bounded, for the
attempt history (``outboxkit.transports.exchange``).  Errors are mapped
to outcomes, never raised: a timeout is ``timeout``, a refused or reset
connection is ``connection``, anything else below HTTP is ``transport``.

The deadline.  ``send(..., timeout=T)`` returns within ``T`` seconds of its
start, whatever the receiver does: the name lookup, the connect, the TLS
handshake, the request's upload and the whole answer (headers and body) share
one budget of ``T``.  A receiver that answers one byte at a time is cut off
at ``T``, not at ``T`` per byte as with httpx's per-operation timeouts.  The
drain's lease (``OutboxOptions.minimum_lease``) rests on this bound.  How it
is enforced is in ``outboxkit.transports.deadline``: a network backend for
httpcore's connection pools whose every wait ends at the send's deadline.

Why no ``client=`` (an application's own ``httpx.Client``): a client's
timeouts are per socket operation and its network backend is fixed inside
it, so no public API can give it the deadline; a send through it could
outlive its lease and be claimed twice.  What a client was brought for is an
option of the transport instead: ``ssl_context=`` (mTLS, a private CA),
``proxy=`` (one proxy for every send), ``headers=`` (auth tokens, service
names).  Environment proxies (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``,
``NO_PROXY``, read with ``urllib.request.getproxies`` and ``proxy_bypass``)
go through ``httpcore.HTTPProxy`` on the same deadline backend.  Only
``http://`` proxies are supported (an ``https://`` receiver is still reached
over TLS, end to end, through the proxy's ``CONNECT`` tunnel).  Event hooks
or auth flows need a ``Transport`` of your own (``outboxkit.transports.base``).

Speed (measured in bench/drain_throughput.py, see docs/performance.md): a
send goes straight to an httpcore pool, without httpx's client or
``httpx.Request`` objects; a delivery needs none of what they add (redirects
are not followed, there is no auth, no cookies, no event hooks).  Each
sending thread gets its own connection pools (sharing one TLS context): one
pool shared by sixteen threads spent a sixth of the drainer's CPU handing its
lock from thread to thread.  URLs are parsed once and cached.
"""

from __future__ import annotations

import ssl
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from functools import lru_cache

import httpcore

from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.results import Exchange
from outboxkit.transports.base import Delivery, framing_header_problem, is_broker_url, validate_timeout
from outboxkit.transports.deadline import DeadlineBackend
from outboxkit.transports.exchange import capture_request, with_response

# httpx's package import also imports httpx's own command line (``httpx._main``:
# click, rich and pygments, about 6 MB of the drainer's memory and 35 ms of its
# start-up) whenever those are installed, as outboxkit's CLI extra installs
# them.  Sending uses none of it.  While httpx is first imported here, that one
# submodule is marked absent, so httpx's ``__init__`` takes its own fallback (a
# ``main`` that says its CLI dependencies are missing); the mark is removed at
# once, so anything that imports ``httpx._main`` later still gets it.  An
# application that imported httpx first keeps httpx as it loaded it.
_HIDE_HTTPX_COMMAND_LINE = "httpx" not in sys.modules and "httpx._main" not in sys.modules
if _HIDE_HTTPX_COMMAND_LINE:
    sys.modules["httpx._main"] = None  # type: ignore[assignment]
try:
    import httpx
finally:
    if _HIDE_HTTPX_COMMAND_LINE:
        del sys.modules["httpx._main"]

__all__ = ["HttpTransport"]

# How much of a non-2xx response body is kept in last_error: enough to read
# the receiver's complaint, not enough to bloat the table.
ERROR_BODY_LIMIT = 500
# httpx's default: an idle connection older than this is not reused, which
# narrows the race with a receiver that closes idle connections.
KEEPALIVE_EXPIRY_SECONDS = 5.0
# A timeout that fires this close to the deadline is the deadline's.
_DEADLINE_TOLERANCE = 0.005
_REMOVED_ARGUMENTS = {
    "client": (
        "HttpTransport(client=...) was removed: an httpx.Client's timeouts are per socket operation, so a send "
        "through it could outlive its lease. Pass ssl_context= (mTLS, private CA), proxy= or headers= instead, "
        "or write your own Transport (outboxkit.transports.base)"
    ),
}
_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
# The route of pinned deliveries (Delivery.pinned_to): direct, in pools no other send shares.
_PINNED = "pinned:"
_PHASES = {
    "ConnectTimeout": "connecting",
    "WriteTimeout": "sending the request",
    "ReadTimeout": "reading the answer",
    "PoolTimeout": "waiting for a connection",
}


class HttpTransport:
    """Delivers over HTTP(S) through per-thread httpcore pools, each send within its ``timeout``.

    ``timeout`` (the outbox's, passed to every ``send``) is a hard total
    deadline per attempt; ``connect_timeout`` additionally bounds the name
    lookup with the TCP connect, and the TLS handshake.  ``ssl_context``
    replaces the default (certifi's CAs, ``SSL_CERT_FILE``/``SSL_CERT_DIR``
    honoured) for client certificates or a private CA.  ``proxy`` sends
    everything through one ``http://`` proxy (credentials in the URL are
    sent as proxy auth); without it, and with ``trust_env`` (the default),
    the environment's proxies apply as described in the module docstring.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
        trust_env: bool = True,
        connect_timeout: float = 5.0,
        max_connections: int = 100,
        headers: dict[str, str] | None = None,
        user_agent: str = "outboxkit",
        **removed: object,
    ) -> None:
        for name in removed:
            raise ConfigurationError(_REMOVED_ARGUMENTS.get(name, f"HttpTransport() got an unexpected keyword argument {name!r}"))
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise ConfigurationError(f"HttpTransport(ssl_context=...) must be an ssl.SSLContext, got {ssl_context!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigurationError(f"HttpTransport(max_connections=...) must be a positive int, got {max_connections!r}")
        try:
            self._connect_timeout = validate_timeout(connect_timeout)
        except ValueError as exc:
            raise ConfigurationError(f"HttpTransport(connect_timeout=...): {exc}") from None
        default_headers = {"User-Agent": user_agent, **(headers or {})}
        for name, value in default_headers.items():
            # The message names the header, never its value: it may be a token.
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigurationError(f"HttpTransport headers must map str to str; header {name!r} is not")
            if not (name + value).isascii() or any(character in name + value for character in "\r\n\0"):
                raise ConfigurationError(f"HttpTransport header {name!r} must be ASCII without line breaks")
            framing = framing_header_problem(name)
            if framing is not None:
                raise ConfigurationError(f"HttpTransport headers {framing}")
        self._default_headers = [(name, value, name.lower()) for name, value in default_headers.items()]
        self._max_connections = max_connections
        self._tls = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        self._backend = DeadlineBackend()
        # Proxies: scheme -> proxy URL, and each proxy URL's httpcore settings.
        self._proxy_for_scheme: dict[str, str] = {}
        self._proxies: dict[str, tuple[httpcore.URL, tuple[str, str] | None]] = {}
        self._honour_no_proxy = proxy is None
        if proxy is not None:
            found = {"http": proxy, "https": proxy}
        else:
            found = _environment_proxies() if trust_env else {}
        for scheme, url in found.items():
            self._proxy_for_scheme[scheme] = url
            self._proxies[url] = _proxy_settings(url, explicit=proxy is not None)
        self._routes: dict[tuple[str, str], str | None] = {}
        self._thread_pools = threading.local()
        self._pools: list[httpcore.ConnectionPool | httpcore.HTTPProxy] = []
        self._pools_lock = threading.Lock()
        self._closed = False

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        """One attempt, over within ``timeout`` seconds (a ``timeout`` failure if the answer is not complete by then)."""
        if not delivery.url.startswith(("http://", "https://")) and is_broker_url(delivery.url):
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: {delivery.url.split(':', 1)[0]}:// is a broker's URL and this outbox sends "
                "over HTTP; give the outbox its broker's transport (OutboxOptions(transport=...), docs/transports.md)",
            )
        deadline = self._backend.arm(timeout)
        sent: list[Exchange] = []  # what was sent, once the request is built: kept with a failure too
        try:
            return self._attempt(delivery, idempotency_key, timeout, sent)
        except (httpcore.TimeoutException, httpx.TimeoutException) as exc:
            error = self._timeout_error(exc, timeout, deadline)
            return AttemptResult(failure=FailureKind.TIMEOUT, error=error, exchange=sent[0] if sent else None)
        except (httpcore.NetworkError, httpcore.RemoteProtocolError, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            error = f"connection: {type(exc).__name__}: {exc}"
            return AttemptResult(failure=FailureKind.CONNECTION, error=error, exchange=sent[0] if sent else None)
        except (
            httpcore.ProtocolError,
            httpcore.ProxyError,
            httpcore.UnsupportedProtocol,
            httpx.HTTPError,
            httpx.InvalidURL,  # not an HTTPError
        ) as exc:
            error = f"{type(exc).__name__}: {exc}"
            return AttemptResult(failure=FailureKind.TRANSPORT, error=error, exchange=sent[0] if sent else None)
        finally:
            self._backend.disarm()

    def _attempt(self, delivery: Delivery, idempotency_key: str, timeout: float, sent: list[Exchange]) -> AttemptResult:
        target = _target(delivery.url)
        route: str | None
        if delivery.address is not None:
            # A guarded send (outboxkit.url_guard): straight to the checked address, in pools of its own, never
            # through a proxy (which would resolve the name again).
            self._backend.pin(target.connect_host, target.connect_port, delivery.address)
            route = _PINNED
        else:
            route = self._route(target)
        own = delivery.headers
        present = {name.lower() for name in own}
        # A delivery's headers never frame or route the request (outboxkit.transports.base refuses those): the
        # Host and Content-Length sent are always these.
        named = [(name, value) for name, value, lowered in self._default_headers if lowered not in present]
        named.extend(own.items())
        named.append(("Idempotency-Key", idempotency_key))
        body = delivery.body()
        if body is not None and "content-type" not in present:
            named.append(("Content-Type", "application/json"))
        if body is not None or delivery.method in _METHODS_WITH_BODY:
            named.append(("Content-Length", str(len(body)) if body is not None else "0"))
        headers: list[tuple[str, str] | tuple[bytes, bytes]] = [(b"Host", target.host_header), *named]
        sent.append(capture_request(delivery.method, delivery.url, named, body))
        request = httpcore.Request(
            delivery.method,
            target.url,
            headers=headers,
            content=body,
            extensions={"timeout": _timeouts(timeout, min(self._connect_timeout, timeout))},
        )
        response = self._pool_for(route).handle_request(request)
        try:
            content = response.read()
        finally:
            response.close()
        status = response.status
        exchange = with_response(sent[0], status, response.headers, content)
        if 200 <= status < 300:
            return AttemptResult(status_code=status, exchange=exchange)
        text = httpx.Response(status, headers=response.headers, content=content).text if content else ""
        return AttemptResult(
            status_code=status,
            error=f"HTTP {status}" + (f": {text[:ERROR_BODY_LIMIT]}" if text else ""),
            retry_after=next(
                (value.decode("latin-1") for name, value in response.headers if name.lower() == b"retry-after"), None
            ),
            exchange=exchange,
        )

    def _timeout_error(self, exc: Exception, timeout: float, deadline: float) -> str:
        name = type(exc).__name__
        if time.monotonic() >= deadline - _DEADLINE_TOLERANCE:
            return f"timeout: no complete answer within {timeout:g} s (deadline; {name} while {_PHASES.get(name, 'sending')})"
        if name == "ConnectTimeout":
            return f"timeout: no connection within connect_timeout {self._connect_timeout:g} s ({name}: {exc})"
        return f"timeout: {name}: {exc}"

    def _route(self, target: _Target) -> str | None:
        """The proxy URL this target goes through, or None for a direct connection."""
        if not self._proxy_for_scheme:
            return None
        key = (target.scheme, target.netloc)
        try:
            return self._routes[key]
        except KeyError:
            pass
        route = self._proxy_for_scheme.get(target.scheme)
        if route is not None and self._honour_no_proxy and urllib.request.proxy_bypass(target.netloc):
            route = None
        if len(self._routes) >= 1024:  # an outbox sending to very many hosts: keep the cache bounded
            self._routes.clear()
        self._routes[key] = route
        return route

    def _pool_for(self, route: str | None) -> httpcore.ConnectionPool | httpcore.HTTPProxy:
        pools: dict[str | None, httpcore.ConnectionPool | httpcore.HTTPProxy] | None = getattr(self._thread_pools, "pools", None)
        if pools is None:
            pools = self._thread_pools.pools = {}
        pool = pools.get(route)
        if self._closed:
            raise httpx.TransportError("the transport is closed")
        if pool is None:
            pool = self._new_pool(route)
            with self._pools_lock:
                if self._closed:
                    pool.close()
                    raise httpx.TransportError("the transport is closed")
                self._pools.append(pool)
            pools[route] = pool
        return pool

    def _new_pool(self, route: str | None) -> httpcore.ConnectionPool | httpcore.HTTPProxy:
        if route is None or route == _PINNED:
            return httpcore.ConnectionPool(
                ssl_context=self._tls,
                max_connections=self._max_connections,
                max_keepalive_connections=self._max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                network_backend=self._backend,
            )
        proxy_url, proxy_auth = self._proxies[route]
        return httpcore.HTTPProxy(
            proxy_url=proxy_url,
            proxy_auth=proxy_auth,
            ssl_context=self._tls,
            max_connections=self._max_connections,
            max_keepalive_connections=self._max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            network_backend=self._backend,
        )

    def close(self) -> None:
        """Close every pooled connection; a later send is a ``transport`` failure."""
        with self._pools_lock:
            self._closed = True
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class _Target:
    url: httpcore.URL
    host_header: bytes
    scheme: str
    netloc: str
    connect_host: str  # what httpcore hands the network backend to connect to
    connect_port: int


@lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    # Parsing a URL (IDNA, normalisation) is a visible share of a send's CPU,
    # and an outbox sends to few distinct URLs.  Nothing below mutates one.
    parsed = httpx.URL(url)
    return _Target(
        url=httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path),
        host_header=parsed.netloc,
        scheme=parsed.scheme,
        netloc=parsed.netloc.decode("ascii"),
        connect_host=parsed.raw_host.decode("ascii"),
        connect_port=parsed.port or (443 if parsed.scheme == "https" else 80),
    )


@lru_cache(maxsize=64)
def _timeouts(timeout: float, connect: float) -> dict[str, float]:
    # httpcore's per-operation timeouts; the deadline backend cuts each to the time left.
    return {"connect": connect, "read": timeout, "write": timeout, "pool": timeout}


def _environment_proxies() -> dict[str, str]:
    found = urllib.request.getproxies()
    proxies = {scheme: found.get(scheme) or found.get("all") for scheme in ("http", "https")}
    return {scheme: url for scheme, url in proxies.items() if url}


def _proxy_settings(url: str, *, explicit: bool) -> tuple[httpcore.URL, tuple[str, str] | None]:
    where = "HttpTransport(proxy=...)" if explicit else "the environment's proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)"
    hint = "" if explicit else "; set a supported one or pass HttpTransport(trust_env=False)"
    if not isinstance(url, str):
        raise ConfigurationError(f"{where} must be a URL string, got {type(url).__name__}")
    try:
        parsed = httpx.URL(url if "://" in url else f"http://{url}")
    except httpx.InvalidURL:
        raise ConfigurationError(f"{where} is not a valid URL{hint}") from None  # the URL may hold a password
    if parsed.scheme != "http" or not parsed.host:
        raise ConfigurationError(
            f"{where}: only http:// proxies are supported, got a {parsed.scheme}:// one (an https:// receiver is "
            f"still reached over TLS through the proxy's CONNECT tunnel){hint}"
        )
    auth = (parsed.username, parsed.password) if parsed.username else None
    return httpcore.URL(scheme=b"http", host=parsed.raw_host, port=parsed.port, target=b"/"), auth
