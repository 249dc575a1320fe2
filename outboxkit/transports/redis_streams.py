"""Redis Streams delivery on redis-py's asyncio client (the ``redis`` extra: ``pip install 'outboxkit[redis]'``).

A row goes to ``redis://host:port/<db>/<stream>`` (``rediss://`` for TLS): one
``XADD <stream> * ...`` whose entry holds the fields

==================  ==========================================================
``idempotency_key``  the row's idempotency key
``body``             the delivery's JSON (absent when it has none)
``key``              the delivery's ``key`` (absent when it has none)
``headers``          the delivery's headers as a JSON object (absent when none)
==================  ==========================================================

Redis does not de-duplicate.  A send whose answer is lost (a timeout, a
connection cut after the command left) is retried, and the stream then holds
the entry twice, with the same ``idempotency_key``.  A consumer drops the
second copy itself, recording the key in the same transaction as the entry's
effect: ``outboxkit.inbox.redis_streams`` does (a marker set in Redis before
the effect commits would lose the entry if the consumer died between the two).

The outcome rules:

* accepted (``done``) only on the entry id ``XADD`` answers (the server
  appended the entry);
* ``rejected`` (``stuck`` at once): an entry over the server's
  ``proto-max-bulk-len`` ("Protocol error: invalid bulk length"), and a key
  that holds another type than a stream (``WRONGTYPE``): neither changes by
  sending again;
* refused before sending (``stuck``): a URL whose path is not ``/<db>/<stream>``;
* retried: the server down or unreachable, a connection closed mid-send, no
  answer by the deadline, ``OOM`` (``maxmemory`` reached: room comes back as
  consumers trim), ``LOADING``, ``BUSY``, ``READONLY`` (a failover), and any
  other error answer, and credentials the server refuses (``NOAUTH``,
  ``WRONGPASS``, ``NOPERM``): they are the transport's, not the message's, so
  the breaker opens and the rows wait, attempts kept, until they are fixed.

One client (with its own connection pool) per server and database, made on
first use; the sends of a batch are in flight together
(``outboxkit.transports.event_loop``).  Credentials are given here, never in a
delivery's URL.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import unquote, urlsplit

from outboxkit.errors import ConfigurationError
from outboxkit.policy import AttemptResult, FailureKind
from outboxkit.transports.base import Delivery
from outboxkit.transports.event_loop import EventLoopThread

__all__ = ["RedisStreamsTransport"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'outboxkit[redis]'"
_REJECTED_ANSWERS = ("Protocol error: invalid bulk length", "WRONGTYPE")


def _redis() -> Any:
    """The one place redis-py is imported."""
    try:
        import redis.asyncio
        import redis.exceptions
    except ImportError:
        raise ConfigurationError(f"RedisStreamsTransport needs redis: {INSTALL_HINT}") from None
    return redis


class RedisStreamsTransport:
    """Appends each delivery to a Redis stream with ``XADD`` and waits for its entry id; never raises for a failed send.

    ``username`` and ``password`` authenticate (ACL users, or the password
    alone); ``connect_timeout`` bounds making a connection (the send's own
    deadline bounds it too).
    """

    def __init__(
        self, *, username: str | None = None, password: str | None = None, connect_timeout: float = 2.0
    ) -> None:
        self._redis = _redis()
        self._options: dict[str, Any] = {
            "username": username, "password": password, "socket_connect_timeout": connect_timeout,
        }
        self._loop = EventLoopThread("outboxkit-redis")
        self._clients: dict[tuple[str, str, int], Any] = {}
        # Each server's proto-max-bulk-len, read once (None where CONFIG is not allowed): an entry over it is
        # refused here, because the server answers it by closing the connection, which a client still writing
        # may see as a reset rather than as the answer.
        self._bulk_limits: dict[tuple[str, str, int], int | None] = {}

    def send(self, delivery: Delivery, *, idempotency_key: str, timeout: float) -> AttemptResult:
        parts = urlsplit(delivery.url)
        if parts.scheme not in ("redis", "rediss"):
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: RedisStreamsTransport sends redis:// URLs, got {parts.scheme}://",
            )
        database, _, stream = parts.path.lstrip("/").partition("/")
        if not database.isascii() or not database.isdigit() or not stream:
            return AttemptResult(
                failure=FailureKind.REFUSED,
                error=f"refused before sending: a Redis stream's URL is redis://host:port/<db>/<stream>, got {delivery.url}",
            )
        fields: dict[str, str | bytes] = {"idempotency_key": idempotency_key}
        body = delivery.body()
        if body is not None:
            fields["body"] = body
        if delivery.key is not None:
            fields["key"] = delivery.key
        if delivery.headers:
            fields["headers"] = json.dumps(dict(delivery.headers), separators=(",", ":"))
        server = (parts.scheme, parts.netloc, int(database))
        try:
            return self._loop.run(self._append(server, unquote(stream), fields), timeout=timeout)
        except TimeoutError:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: no answer to XADD within {timeout:g} s")

    async def _append(self, server: tuple[str, str, int], stream: str, fields: dict[str, str | bytes]) -> AttemptResult:
        exceptions = self._redis.exceptions
        try:
            limit = await self._bulk_limit(server)
            over = [name for name, value in fields.items() if limit is not None and len(value) > limit]
            if over:
                return AttemptResult(
                    failure=FailureKind.REJECTED,
                    error=f"rejected: Redis answered Protocol error: invalid bulk length (the entry's {over[0]} is "
                    f"{len(fields[over[0]]):,} bytes, over the server's proto-max-bulk-len of {limit:,})",
                )
            entry = await self._client(server).xadd(stream, fields)
        except exceptions.ResponseError as exc:
            text = str(exc)
            if text.startswith(_REJECTED_ANSWERS):
                return AttemptResult(failure=FailureKind.REJECTED, error=f"rejected: Redis answered {text}")
            return AttemptResult(failure=FailureKind.TRANSPORT, error=f"Redis answered {text}")
        except exceptions.TimeoutError as exc:
            return AttemptResult(failure=FailureKind.TIMEOUT, error=f"timeout: {_describe(exc)}")
        except (exceptions.ConnectionError, OSError) as exc:  # AuthenticationError is a ConnectionError
            return AttemptResult(failure=FailureKind.CONNECTION, error=f"connection: {_describe(exc)}")
        except exceptions.RedisError as exc:
            return AttemptResult(failure=FailureKind.TRANSPORT, error=_describe(exc))
        return AttemptResult(acknowledgement=f"stream {stream} entry {entry.decode() if isinstance(entry, bytes) else entry}")

    async def _bulk_limit(self, server: tuple[str, str, int]) -> int | None:
        if server not in self._bulk_limits:
            try:
                answer = await self._client(server).config_get("proto-max-bulk-len")
                value = answer.get("proto-max-bulk-len") or answer.get(b"proto-max-bulk-len")
                self._bulk_limits[server] = int(value) if value is not None else None
            except self._redis.exceptions.ResponseError:  # CONFIG renamed or refused (managed Redis): not known
                self._bulk_limits[server] = None
        return self._bulk_limits[server]

    def _client(self, server: tuple[str, str, int]) -> Any:
        client = self._clients.get(server)
        if client is None:
            scheme, netloc, database = server
            client = self._redis.asyncio.Redis.from_url(f"{scheme}://{netloc}/{database}", **self._options)
            self._clients[server] = client
        return client

    def close(self) -> None:
        clients = list(self._clients.values())
        self._clients.clear()

        async def close_all() -> None:
            for client in clients:
                await client.aclose()

        self._loop.close(close_all)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
