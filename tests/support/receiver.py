"""A real HTTP receiver on 127.0.0.1 for integration tests.

It records every request (path, idempotency key, body, arrival time) and
answers according to a ``respond`` function that tests replace::

    with Receiver() as receiver:
        receiver.respond = lambda request: Reply(status=503) if request.body["n"] == 3 else Reply()
        ...
        assert receiver.count_by_key()[key] == 1

A ``Reply`` may delay its answer, hang until ``receiver.release()``, reset
the connection (after writing part of an answer, if asked), answer bytes that
are not HTTP (``raw``), or drip its
answer a few bytes at a time (the status line and headers, the body, or
both).  ``receiver.read_pace`` makes the receiver read request bodies slowly,
so a large upload stalls in the sender's socket.
"""

from __future__ import annotations

import collections
import json
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    path: str
    method: str
    key: str | None
    headers: dict[str, str]
    body: Any
    received_at: float  # time.time()


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0
    hang: bool = False  # wait for release() (or the test's end) before answering
    reset: bool = False  # close the connection abruptly (RST) without an answer
    partial: bytes = b""  # with reset: bytes written first, so the connection drops mid-response
    drip: int = 0  # write the answer this many bytes at a time (0: at once), pausing drip_pause between writes
    drip_pause: float = 0.1
    drip_part: str = "all"  # which part drips: "all", "head" (status line and headers) or "body"
    raw: bytes = b""  # written as the whole answer (not HTTP, if the test says so), then the connection closes

    def __post_init__(self) -> None:
        if self.drip_part not in ("all", "head", "body"):
            raise ValueError(f"Reply.drip_part must be 'all', 'head' or 'body', got {self.drip_part!r}")


class _Server(ThreadingHTTPServer):
    # Set on the class: the constructor calls listen() with it.  A short
    # backlog drops connections from a burst of concurrent sends.
    request_queue_size = 512
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops its connection (a killed worker, a send that
        # timed out, a client that refused our certificate) is part of the
        # tests, not a receiver error.
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            return
        super().handle_error(request, client_address)


class Receiver:
    """``tls``: a server-side context; the receiver then speaks HTTPS (``url`` starts with ``https://``)."""

    def __init__(self, *, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Request] = []
        self.respond: Callable[[Request], Reply] = lambda request: Reply()
        self._released = threading.Event()
        self._stopped = threading.Event()
        # (bytes, pause): read request bodies this many bytes at a time, pausing between reads.
        self.read_pace: tuple[int, float] | None = None
        self._arrived = threading.Condition()
        self._in_flight = 0
        self.max_in_flight = 0
        self.connections = 0  # TCP connections accepted (a kept-alive one carries many requests)
        # Per Idempotency-Key: requests being handled at once, and the most ever seen (a row sent twice at once)
        self._in_flight_by_key: collections.Counter[str | None] = collections.Counter()
        self.max_in_flight_by_key: collections.Counter[str | None] = collections.Counter()
        # Per path: requests being handled at once, and the most ever seen (one endpoint's concurrency)
        self.in_flight_by_path: collections.Counter[str] = collections.Counter()
        self.max_in_flight_by_path: collections.Counter[str] = collections.Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def setup(self) -> None:
                super().setup()
                with receiver._arrived:
                    receiver.connections += 1  # one handler per accepted connection

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self._read_body(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                request = Request(
                    path=self.path,
                    method=self.command,
                    key=self.headers.get("Idempotency-Key"),
                    headers=dict(self.headers.items()),
                    body=body,
                    received_at=time.time(),
                )
                receiver._record(request, +1, request.key, request.path)
                try:
                    reply = receiver.respond(request)
                    if reply.delay:
                        time.sleep(reply.delay)
                    if reply.hang:
                        receiver._released.wait(timeout=120)
                    if reply.reset:
                        if reply.partial:
                            self.wfile.write(reply.partial)
                            self.wfile.flush()
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.close_connection = True
                        return
                    if reply.drip:
                        self._drip(reply)
                        return
                    if reply.raw:
                        self.wfile.write(reply.raw)
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                finally:
                    receiver._record(None, -1, request.key, request.path)

            def _read_body(self, length: int) -> bytes:
                if receiver.read_pace is None or not length:
                    return self.rfile.read(length) if length else b""
                size, pause = receiver.read_pace
                pieces: list[bytes] = []
                while length > 0 and not receiver._stopped.wait(pause):
                    piece = self.rfile.read1(min(size, length))
                    if not piece:  # the sender gave up
                        break
                    pieces.append(piece)
                    length -= len(piece)
                return b"".join(pieces)

            def _drip(self, reply: Reply) -> None:
                lines = [f"HTTP/1.1 {reply.status} {self.responses.get(reply.status, ('',))[0]}"]
                lines += [f"{name}: {value}" for name, value in reply.headers.items()]
                lines.append(f"Content-Length: {len(reply.body)}")
                head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
                self.close_connection = True
                if reply.drip_part == "body":
                    self.wfile.write(head)
                    self.wfile.flush()
                dripped = {"all": head + reply.body, "head": head, "body": reply.body}[reply.drip_part]
                for start in range(0, len(dripped), reply.drip):
                    self.wfile.write(dripped[start : start + reply.drip])
                    self.wfile.flush()
                    if receiver._stopped.wait(reply.drip_pause):
                        return
                if reply.drip_part == "head":
                    self.wfile.write(reply.body)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET = _handle

        self._server = _Server(("127.0.0.1", 0), Handler)
        if tls is not None:  # the handshake runs in the handler's thread, on its first read
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self._server.server_address[1]
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self.port}"
        # shutdown() waits for serve_forever to look up from its poll; at the default 0.5 s
        # that wait was most of each receiver test's teardown.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-receiver", daemon=True
        )

    def _record(self, request: Request | None, delta: int, key: str | None, path: str) -> None:
        with self._arrived:
            if request is not None:
                self.requests.append(request)
            self._in_flight += delta
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self._in_flight_by_key[key] += delta
            self.max_in_flight_by_key[key] = max(self.max_in_flight_by_key[key], self._in_flight_by_key[key])
            self.in_flight_by_path[path] += delta
            self.max_in_flight_by_path[path] = max(self.max_in_flight_by_path[path], self.in_flight_by_path[path])
            self._arrived.notify_all()

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def release(self) -> None:
        """Let every hanging request answer."""
        self._released.set()

    def stop(self) -> None:
        self._stopped.set()
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what arrived --------------------------------------------------------

    def keys(self) -> list[str | None]:
        with self._arrived:
            return [request.key for request in self.requests]

    def count_by_key(self) -> collections.Counter[str | None]:
        return collections.Counter(self.keys())

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = 30.0) -> None:
        """Block until ``predicate(self)`` holds (checked on every arrival)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"receiver condition not met within {timeout}s ({len(self.requests)} requests)")
                self._arrived.wait(timeout=min(remaining, 0.5))

    @property
    def in_flight(self) -> int:
        with self._arrived:
            return self._in_flight


def self_signed_certificate(folder: Any, *, common_name: str, alt_name: str) -> Any:
    """A self-signed certificate (``folder / "cert.pem"``, its key beside it) made with the openssl command.

    ``alt_name`` is its subjectAltName, e.g. ``IP:127.0.0.1`` or ``DNS:pinned.test``.
    """
    import shutil
    import subprocess

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem"), "-days", "2",
         "-subj", f"/CN={common_name}", "-addext", f"subjectAltName={alt_name}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return folder / "cert.pem"
