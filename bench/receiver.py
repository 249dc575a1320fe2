"""A light HTTP receiver for benchmarks: a raw asyncio protocol, one process.

It must never be the bottleneck of what it measures, so it does the least an
HTTP/1.1 server can: split requests on the header terminator and
``Content-Length``, remember each ``Idempotency-Key``, and answer
``200`` with an empty body on a kept-alive connection.  No routing, no JSON
parsing.  ``--delay-ms`` answers each request that many milliseconds late
(without blocking other connections), to stand in for a slow receiver.

Two control paths, for the benchmark that drives it:

* ``GET /_keys``: every key seen since the last reset, one per line;
* ``POST /_reset``: forget the keys.

Run it on its own (it prints ``listening <port>`` once ready)::

    python bench/receiver.py --port 0 --delay-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
HEADER_END = b"\r\n\r\n"
# Requests larger than this are refused: a benchmark body is a few hundred bytes.
MAX_REQUEST_BYTES = 1 << 20


class KeyLedger:
    """The idempotency keys seen so far, in arrival order (duplicates kept)."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def dump(self) -> bytes:
        return b"\n".join(self.keys)


def _text_response(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    return head.encode() + body


class ReceiverProtocol(asyncio.Protocol):
    """One client connection.  Answers strictly in request order."""

    def __init__(self, ledger: KeyLedger, delay: float) -> None:
        self.ledger = ledger
        self.delay = delay
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        # The last scheduled answer on this connection; a delayed answer is
        # chained after it so pipelined requests are answered in order.
        self.last_answer_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a TCP server's connection
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(HEADER_END)
            if end < 0:
                if len(self.buffer) > MAX_REQUEST_BYTES:
                    self._close()
                return
            head = bytes(self.buffer[:end])
            length = _content_length(head)
            total = end + len(HEADER_END) + length
            if len(self.buffer) < total:
                return
            del self.buffer[:total]
            self._answer(head)

    def _answer(self, head: bytes) -> None:
        request_line, _, headers = head.partition(b"\r\n")
        if request_line.startswith(b"GET /_keys"):
            self._write(_text_response("200 OK", self.ledger.dump()))
            return
        if request_line.startswith(b"POST /_reset"):
            self.ledger.keys.clear()
            self._write(OK_RESPONSE)
            return
        key = _header(headers, b"idempotency-key")
        if key is not None:
            self.ledger.keys.append(key)
        if not self.delay:
            self._write(OK_RESPONSE)
            return
        loop = asyncio.get_running_loop()
        answer_at = max(loop.time() + self.delay, self.last_answer_at)
        self.last_answer_at = answer_at
        loop.call_at(answer_at, self._write, OK_RESPONSE)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _content_length(head: bytes) -> int:
    value = _header(head, b"content-length")
    return int(value) if value else 0


def _header(head: bytes, lowercase_name: bytes) -> bytes | None:
    for line in head.split(b"\r\n"):
        name, separator, value = line.partition(b":")
        if separator and name.strip().lower() == lowercase_name:
            return value.strip()
    return None


async def serve(port: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    ledger = KeyLedger()
    server = await loop.create_server(
        lambda: ReceiverProtocol(ledger, delay), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    async with server:
        await stopped.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer each request this many ms late")
    arguments = parser.parse_args(argv)
    if arguments.delay_ms < 0:
        parser.error("--delay-ms must be >= 0")
    asyncio.run(serve(arguments.port, arguments.delay_ms / 1000.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
