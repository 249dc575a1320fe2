"""The tests' ``Blackhole`` (tests/support/blackhole.py) really ends when its ``with`` block does.

The drain tests close a drainer after leaving the block and rely on every
send it held ending at once.  Before, the listener went on listening while
its accepting thread was blocked in ``accept()`` (a ``close()`` does not wake
it on Linux): a send that connected after the block had ended was accepted
and held for its whole deadline, the ~30 s wait of
``test_healthy_destinations_keep_flowing_while_another_hangs``.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.blackhole import Blackhole


def _address(blackhole: Blackhole) -> tuple[str, int]:
    host, port = blackhole.url.removeprefix("http://").split(":")
    return host, int(port)


def test_leaving_the_blackhole_closes_what_it_held_and_refuses_new_connections():
    with Blackhole() as blackhole:
        held = socket.create_connection(_address(blackhole), timeout=5)
        held.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        deadline = time.monotonic() + 5
        while blackhole.accepted < 1:
            assert time.monotonic() < deadline, "the blackhole did not accept the connection"
            time.sleep(0.01)
    with held:
        try:
            assert held.recv(1) == b""  # closed by the blackhole, not held open until the timeout
        except ConnectionResetError:
            pass  # closed with the request unread: a reset, which ends a send as quickly
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(_address(blackhole), timeout=5).close()
