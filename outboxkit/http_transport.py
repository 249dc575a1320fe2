"""HTTP delivery on httpx.

One ``httpx.Client`` is shared by every delivery (and every thread) of a
transport, so connections are pooled and reused.  Each attempt carries the
row's ``Idempotency-Key`` header.  Errors are mapped to outcomes, never
raised: a timeout is ``timeout``, a refused or reset connection is
``connection``, anything else inside httpx is ``transport``.
"""

from __future__ import annotations

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
        self._client = client or httpx.Client(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            headers={"User-Agent": user_agent, **(headers or {})},
            follow_redirects=False,
        )

    @property
    def client(self) -> httpx.Client:
        return self._client

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        headers = dict(delivery.headers)
        headers["Idempotency-Key"] = idempotency_key
        body = delivery.body()
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        try:
            response = self._client.request(
                delivery.method,
                delivery.url,
                content=body,
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=min(self._connect_timeout, timeout)),
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

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
