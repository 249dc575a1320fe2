"""NATS JetStream delivery on nats-py (the ``nats`` extra: ``pip install 'outboxkit[nats]'``).

A row goes to ``nats://host:port/<subject>``: it is published to the subject
with JetStream's publish, and the row's idempotency key is the ``Nats-Msg-Id``
header, so JetStream drops a second copy of the same row within the stream's
duplicate window (two minutes unless the stream says otherwise).  The
delivery's ``key`` travels as the ``Outboxkit-Key`` header, its ``headers`` as
the message's headers, its JSON as the payload.

The outcome rules:

* accepted (``done``) only on JetStream's acknowledgement (a ``PubAck``: the
  stream stored the message, or already had it under this id);
* ``rejected`` (``stuck`` at once, nothing will change by sending it again):
  no stream takes the subject (JetStream's "no responders"; create the stream,
  then reset the rows), a message over the server's ``max_payload`` or the
  stream's ``max_msg_size``, and any other 4xx answer of JetStream's API;
* retried: the server down or unreachable, a connection closed mid-send, no
  acknowledgement by the deadline (the message may be stored; the retry
  carries the same ``Nats-Msg-Id``, which JetStream drops), JetStream
  unavailable (503), a server error (500), and credentials the server refuses.
  Credentials are the transport's, not the message's: every row to that
  server fails alike, so the breaker opens after a few attempts and the rows
  wait, attempts kept, until the credentials are fixed; making each row
  stuck would only leave a person to reset them all.

One connection per server (scheme, host, port), made on first use and made
again after it breaks; the sends of a batch share it and are in flight
together (``outboxkit.transports.event_loop``).  Credentials and TLS are given
here, never in a delivery's URL.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.event_loop import EventLoopThread

__all__ = ["NatsTransport"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'outboxkit[nats]'"
MESSAGE_ID_HEADER = "Nats-Msg-Id"
KEY_HEADER = "Outboxkit-Key"


def _nats() -> Any:
    """The one place nats-py is imported."""
    try:
        import nats
        import nats.errors
        import nats.js.errors
    except ImportError:
        raise ConfigurationError(f"NatsTransport needs nats-py: {INSTALL_HINT}") from None
    return nats


class NatsTransport:
    """Publishes each delivery to JetStream and waits for its acknowledgement; never raises for a failed send.

    ``user`` and ``password``, or ``token``, authenticate; ``tls`` is an
    ``ssl.SSLContext`` for servers that require TLS.  ``connect_timeout``
    bounds making a connection (the send's own deadline bounds it too).
    """

    def __init__(
        self,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 2.0,
    ) -> None:
        self._nats = _nats()
        self._options: dict[str, Any] = {
            "user": user, "password": password, "token": token, "tls": tls,
            "connect_timeout": connect_timeout,
            # One try per send: a server that is down is a failed attempt now, retried by the drain's rules,
            # not a send that waits inside the client for the server to come back.
            # (nats-py tries a server once more after a failed connect before it gives up on it: at once, here.)
            "allow_reconnect": False, "max_reconnect_attempts": 1, "reconnect_time_wait": 0,
            "name": "outboxkit",
        }
        self._loop = EventLoopThread("outboxkit-nats")
        self._clients: dict[str, Any] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        parts = urlsplit(delivery.url)
        if parts.scheme != "nats":
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: NatsTransport sends nats:// URLs, got {parts.scheme}://",
            )
        server = f"nats://{parts.netloc}"
        subject = unquote(parts.path.lstrip("/"))
        headers = {**delivery.headers, MESSAGE_ID_HEADER: idempotency_key}
        if delivery.key is not None:
            headers[KEY_HEADER] = delivery.key
        try:
            return self._loop.run(self._publish(server, subject, delivery.body() or b"", headers, timeout), timeout=timeout)
        except TimeoutError:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no JetStream acknowledgement within {timeout:g} s")

    async def _publish(self, server: str, subject: str, body: bytes, headers: Mapping[str, str], timeout: float) -> AttemptResult:
        errors = self._nats.errors
        js_errors = self._nats.js.errors
        try:
            client = await self._client(server)
        except (errors.Error, OSError, asyncio.TimeoutError) as exc:  # refused, unreachable, credentials refused
            error = f"connection: cannot connect to {server}: {_describe(exc)}"
            return AttemptResult(failure=FailureKind.CONNECTION, error=error)
        try:
            ack = await client.jetstream().publish(subject, body, timeout=timeout, headers=dict(headers))
        except js_errors.NoStreamResponseError:
            return AttemptResult(
                failure=FailureKind.REJECTED,
                error=f"rejected: no JetStream stream takes the subject {subject!r} (create one, then reset the rows)",
            )
        except errors.MaxPayloadError:
            return AttemptResult(
                failure=FailureKind.REJECTED,
                error=f"rejected: the message ({len(body)} bytes of payload) is over the server's max_payload "
                f"({client.max_payload} bytes)",
            )
        except js_errors.APIError as exc:
            return _api_error(exc)
        except errors.TimeoutError:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no JetStream acknowledgement within {timeout:g} s")
        except (errors.ConnectionClosedError,
                errors.StaleConnectionError, errors.OutboundBufferLimitError, errors.ConnectionReconnectingError,
                errors.ConnectionDrainingError, errors.ProtocolError, OSError) as exc:
            await self._forget(server)
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {_describe(exc)}")
        except errors.Error as exc:
            return AttemptResult(failure=FailureKind.TRANSPORT, error=_describe(exc))
        duplicate = " (a duplicate: already stored under this id)" if ack.duplicate else ""
        return AttemptResult(acknowledgement=f"stream {ack.stream} seq {ack.seq}{duplicate}")

    async def _client(self, server: str) -> Any:
        client = self._clients.get(server)
        if client is not None and client.is_connected:
            return client
        lock = self._connecting.setdefault(server, asyncio.Lock())
        async with lock:  # the sends that find no connection wait for one connect, not one each
            client = self._clients.get(server)
            if client is not None and client.is_connected:
                return client
            if client is not None:
                await self._forget(server)
            seen: list[Exception] = []

            async def client_error(exc: Exception) -> None:
                # The client reports here each failure it sees; the send's result is what counts.
                seen.append(exc)
                logger.debug("nats client of %s: %s", server, _describe(exc))

            try:
                client = await self._nats.connect(servers=[server], error_cb=client_error, **self._options)
            except self._nats.errors.NoServersError:
                last = _describe(seen[-1]) if seen else "no answer"
                raise ConnectionError(last) from None
            self._clients[server] = client
            return client

    async def _forget(self, server: str) -> None:
        client = self._clients.pop(server, None)
        if client is not None and not client.is_closed:
            try:
                await client.close()
            except Exception as exc:  # already broken: nothing to flush
                logger.debug("closing the connection to %s: %s", server, exc)

    def close(self) -> None:
        async def close_all() -> None:
            for server in list(self._clients):
                await self._forget(server)

        self._loop.close(close_all)
        self._connecting.clear()


def _api_error(exc: Any) -> AttemptResult:
    """A JetStream API error: a 4xx other than 408 and 429 refuses this message for good; anything else is retried."""
    code = exc.code or 0
    text = f"JetStream answered {code} ({exc.err_code}): {exc.description}"
    if 400 <= code < 500 and code not in (408, 429):
        return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected: {text}")
    return AttemptResult(failure=FailureKind.TRANSPORT, error=text)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
