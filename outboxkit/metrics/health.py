"""Liveness, readiness and metrics over HTTP for a process without a web framework (``outboxkit worker``).

::

    server = HealthServer(port=9464, readiness=worker.readiness, metrics=metrics.render)
    ...
    server.close()

One small threaded HTTP server answers exactly three paths:

* ``/healthz``: 200 ``ok`` while the process answers at all (liveness: restart
  it when this fails);
* ``/readyz``: 200 ``ready`` when ``readiness()`` returns None, else 503 with
  its one-line reason (``outboxkit.integration.readiness``: the drain loops
  are running, the database answers and the schedule loop runs);
* ``/metrics``: the Prometheus text format from ``metrics()``, when given;

and 404 everywhere else, so a probe or a scraper pointed at the wrong path
fails instead of reading a page of metrics.  ``GET`` and ``HEAD`` only.

``ProbeApp`` answers the same two probes as ASGI routes of an application
(``outboxkit.integration.liveness_app`` and ``readiness_app``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outboxkit.errors import ConfigurationError

__all__ = ["METRICS_CONTENT_TYPE", "HealthServer", "ProbeApp", "ready_answer"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
LIVE = (200, b"ok\n")


def ready_answer(readiness: Callable[[], str | None]) -> tuple[int, bytes]:
    """``/readyz``'s status and body: 200 ``ready``, or 503 ``not ready: <reason>``."""
    try:
        reason = readiness()
    except Exception as exc:  # a readiness check that breaks says so, never "ready"
        reason = f"the readiness check failed: {type(exc).__name__}: {exc}"
    return (200, b"ready\n") if reason is None else (503, f"not ready: {reason}\n".encode())


class ProbeApp:
    """An ASGI app answering a liveness probe (``readiness=None``: 200 ``ok``) or a readiness probe.

    For an application's own routes: ``app.add_route("/readyz", ProbeApp(check))``
    (``outboxkit.integration.readiness_app`` builds it for a kit).  The
    check runs in a thread: it may query the database.
    """

    def __init__(self, readiness: Callable[[], str | None] | None = None) -> None:
        self._readiness = readiness

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._readiness is None:
            status, body = LIVE
        else:
            status, body = await asyncio.to_thread(ready_answer, self._readiness)
        headers = [(b"content-type", TEXT.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``host:port`` in a daemon thread (``port=0``: a free one)."""

    def __init__(
        self,
        *,
        port: int,
        host: str = "127.0.0.1",
        readiness: Callable[[], str | None] | None = None,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"the port must be 0-65535, got {port!r}")
        handler = _handler(readiness or (lambda: None), metrics)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:  # in use, or an address this host does not have
            raise ConfigurationError(f"cannot serve metrics and health checks on {host}:{port}: {exc.strerror or exc}") from None
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="outboxkit-health", daemon=True)
        self._thread.start()
        self._closed = False

    def close(self) -> None:
        """Stop listening (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _handler(readiness: Callable[[], str | None], metrics: Callable[[], bytes] | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def _answer(self, *, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            content_type = TEXT
            if path == "/healthz":
                status, body = LIVE
            elif path == "/readyz":
                status, body = ready_answer(readiness)
            elif path == "/metrics" and metrics is not None:
                status, body, content_type = 200, metrics(), METRICS_CONTENT_TYPE
            else:
                status, body = 404, b"not found: this server answers /healthz, /readyz and /metrics\n"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None  # probes every few seconds would flood the log

    return Handler
