"""A TCP receiver that accepts every connection and never answers, for tests of hanging destinations.

``Blackhole`` counts the connections open at once (``most_open``).  Leaving
its ``with`` block ends it for good: the listener stops listening (a later
connect is refused), the connections still waiting in its backlog are reset,
and every connection it accepted is closed, so each send it was holding ends
at once with a connection error instead of at its deadline.

Closing a listening socket does not do the first part on Linux while another
thread is blocked in its ``accept()``: the blocked call keeps the socket
alive, still listening, and it returned the next connection after the
accepted ones had been closed, a connection left open that held its send for
the whole deadline.  So ``__exit__`` shuts the listener down (which wakes the
blocked ``accept()``), waits for the accepting thread to end, and only then
closes the listener and the accepted connections.
"""

from __future__ import annotations

import socket
import threading


class Blackhole:
    """A TCP listener that accepts every connection and never answers; counts connections open at once."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self.open_now = 0
        self.most_open = 0
        self.accepted = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:  # shut down by __exit__
                return
            with self._lock:
                self._connections.append(connection)
                self.accepted += 1
                self.open_now = sum(1 for item in self._connections if _alive(item))
                self.most_open = max(self.most_open, self.open_now)

    def __enter__(self) -> Blackhole:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below, which a close() alone does not
        except OSError:
            pass  # not listening any more
        self._thread.join()
        self._listener.close()  # what is still in the backlog is reset
        with self._lock:
            for connection in self._connections:
                connection.close()


def _alive(connection: socket.socket) -> bool:
    try:
        connection.setblocking(False)
        return connection.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True  # nothing to read yet and not closed: the sender still waits
    except OSError:
        return False
