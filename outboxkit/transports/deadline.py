"""A hard total deadline per send, enforced under httpcore.

httpx and httpcore bound each socket operation (one connect, one read, one
write), not a request: a receiver that answers one byte a second never trips
a 10 s read timeout, and a hanging DNS lookup has no timeout at all.  The
drain sizes its lease on a send ending within its ``timeout``
(``OutboxOptions.minimum_lease``), so the HTTP transport enforces that bound
itself.

``DeadlineBackend`` is an httpcore network backend (httpcore's public
extension point, ``network_backend=``) that knows each thread's deadline.
Sync httpcore does all of a request's I/O on the calling thread, so
``HttpTransport.send`` arms a thread-local deadline and every wait below it
is cut to the time left:

* DNS: ``getaddrinfo`` runs on a helper thread (at most ``RESOLVER_THREADS``
  at once) and is waited for at most the time left; an IP literal is not
  looked up;
* TCP: the resolved addresses are tried in turn, each with an equal share
  of the time left;
* TLS handshake: one ``wrap_socket`` whose socket timeout is the time left
  (CPython bounds the whole handshake by it);
* each ``send`` and ``recv`` of the request and the answer: the socket
  timeout is the time left.  The write loop is ours, not httpcore's, because
  a receiver that reads slowly makes one ``write`` many ``send`` calls;
* once the deadline has passed, the next operation raises httpcore's
  ``ConnectTimeout``, ``WriteTimeout`` or ``ReadTimeout`` at once.

A stream belongs to a pooled connection and outlives the send that opened it,
so it reads the deadline at every operation, never when it was made.

TLS inside TLS (an ``https://`` proxy in front of an ``https://`` receiver)
is not supported: ``HttpTransport`` refuses ``https://`` proxy URLs.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from typing import Any

import httpcore

__all__ = ["DeadlineBackend", "RESOLVER_THREADS"]

# Name lookups in flight at once per backend.  A lookup that hangs keeps its
# thread until the system resolver gives up; the send stops waiting for it at
# its deadline either way.
RESOLVER_THREADS = 8


class DeadlineBackend(httpcore.NetworkBackend):
    """A sync httpcore backend whose every wait ends at the thread's deadline."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lookup_slots = threading.BoundedSemaphore(RESOLVER_THREADS)

    # -- the deadline of the send running on this thread ---------------------

    def arm(self, seconds: float) -> float:
        """Start this thread's deadline ``seconds`` from now; returns it (``time.monotonic``)."""
        deadline = time.monotonic() + seconds
        self._local.deadline = deadline
        return deadline

    def disarm(self) -> None:
        self._local.deadline = None
        self._local.pin = None

    def pin(self, host: str, port: int, address: str) -> None:
        """Until ``disarm``, this thread connects to ``host``:``port`` at ``address`` (an IP a guard checked), and to
        nothing else: a guarded send never resolves its host again (``outboxkit.url_guard``)."""
        self._local.pin = (host, port, address)

    def _pinned(self, host: str, port: int) -> str:
        pin: tuple[str, int, str] | None = getattr(self._local, "pin", None)
        if pin is None:
            return host
        if (host, port) != pin[:2]:
            raise httpcore.ConnectError(f"a pinned send connects only to {pin[0]}:{pin[1]}, not {host}:{port}")
        return pin[2]

    def time_left(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` cut to the time left before the deadline; raises ``expired`` once it has passed."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the send's deadline has passed")
        return left if timeout is None or timeout > left else timeout

    # -- httpcore's NetworkBackend -------------------------------------------

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        # ``timeout`` (the connect timeout) bounds the lookup and the connect together.
        budget = self.time_left(timeout, httpcore.ConnectTimeout)
        ends = None if budget is None else time.monotonic() + budget
        addresses = self._resolve(self._pinned(host, port), port, budget)
        last_error: OSError | None = None
        for index, (family, kind, protocol, _, address) in enumerate(addresses):
            left = self._left_until(ends, f"no connection to {host}:{port} in time")
            if left is not None:  # share the time out, so one black-holed address (often IPv6) leaves room for the next
                left /= len(addresses) - index
            try:
                sock = socket.socket(family, kind, protocol)
            except OSError as exc:  # out of file descriptors, an address family the host lacks
                last_error = exc
                continue
            try:
                for option in socket_options or ():
                    sock.setsockopt(*option)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if local_address is not None:
                    sock.bind((local_address, 0))
                sock.settimeout(left)
                sock.connect(address)
            except OSError as exc:  # includes TimeoutError: try the next address while time is left
                sock.close()
                last_error = exc
                continue
            return DeadlineStream(sock, self)
        if isinstance(last_error, TimeoutError):
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} in time") from last_error
        raise httpcore.ConnectError(str(last_error or f"no address for {host}")) from last_error

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("outboxkit's HTTP transport does not connect to unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # -- helpers ---------------------------------------------------------------

    def _left_until(self, ends: float | None, message: str) -> float | None:
        if ends is None:
            return None
        left = ends - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout(message)
        return left

    def _resolve(self, host: str, port: int, budget: float | None) -> list[tuple[Any, ...]]:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:  # a literal needs no lookup, and getaddrinfo returns it at once
            try:
                return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            except OSError as exc:
                raise httpcore.ConnectError(f"address {host!r}: {exc}") from exc
        ends = None if budget is None else time.monotonic() + budget
        if not self._lookup_slots.acquire(timeout=budget):
            raise httpcore.ConnectTimeout(f"name lookup of {host!r} did not finish in time (every lookup thread is busy)")
        lookup = _Lookup(host, port, self._lookup_slots)
        try:
            threading.Thread(target=lookup.run, name="outboxkit-dns", daemon=True).start()
        except RuntimeError as exc:  # the process is out of threads
            self._lookup_slots.release()
            raise httpcore.ConnectError(f"name lookup of {host!r} could not start: {exc}") from exc
        if not lookup.done.wait(self._left_until(ends, f"name lookup of {host!r} did not finish in time")):
            raise httpcore.ConnectTimeout(f"name lookup of {host!r} did not finish in time")
        if lookup.error is not None:
            raise httpcore.ConnectError(f"name lookup of {host!r} failed: {lookup.error}") from lookup.error
        return lookup.addresses


class _Lookup:
    """One ``getaddrinfo`` on a daemon thread, so a hung resolver never holds up a send or the exit."""

    def __init__(self, host: str, port: int, slots: threading.BoundedSemaphore) -> None:
        self.host, self.port, self._slots = host, port, slots
        self.done = threading.Event()
        self.addresses: list[tuple[Any, ...]] = []
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.addresses = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
        except OSError as exc:
            self.error = exc
        finally:
            self._slots.release()
            self.done.set()


class DeadlineStream(httpcore.NetworkStream):
    """A socket (plain or TLS) whose every read, write and handshake waits at most the time left."""

    def __init__(self, sock: socket.socket, backend: DeadlineBackend) -> None:
        self._sock = sock
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        left = self._backend.time_left(timeout, httpcore.ReadTimeout)
        try:
            self._sock.settimeout(left)
            return self._sock.recv(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        while view:
            left = self._backend.time_left(timeout, httpcore.WriteTimeout)
            try:
                self._sock.settimeout(left)
                sent = self._sock.send(view)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc
            view = view[sent:]

    def close(self) -> None:
        self._sock.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        if isinstance(self._sock, ssl.SSLSocket):
            self.close()
            raise httpcore.UnsupportedProtocol("TLS inside TLS (an https:// proxy) is not supported")
        try:
            self._sock.settimeout(self._backend.time_left(timeout, httpcore.ConnectTimeout))
            wrapped = ssl_context.wrap_socket(self._sock, server_hostname=server_hostname)
        except TimeoutError as exc:
            self.close()
            raise httpcore.ConnectTimeout(str(exc) or "TLS handshake timed out") from exc
        except OSError as exc:  # ssl.SSLError (a failed verification, too) is an OSError
            self.close()
            raise httpcore.ConnectError(str(exc)) from exc
        except httpcore.ConnectTimeout:
            self.close()
            raise
        return DeadlineStream(wrapped, self._backend)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":  # httpcore asks it for the negotiated ALPN protocol
            return self._sock if isinstance(self._sock, ssl.SSLSocket) else None
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "socket":
            return self._sock
        if info == "is_readable":
            return _is_readable(self._sock)
        return None


def _is_readable(sock: socket.socket) -> bool:
    # An idle pooled connection that is readable has been closed by the
    # receiver (or sent junk): the pool then drops it instead of reusing it.
    fileno = sock.fileno()
    if fileno < 0:
        return True
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([fileno], [], [], 0)[0])
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))
