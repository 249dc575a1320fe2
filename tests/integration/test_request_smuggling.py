"""No request is smuggled through a delivery's headers to a keep-alive receiver on 127.0.0.1.

The receiver here reads raw bytes and frames each request as a strict
HTTP/1.1 server does (``Transfer-Encoding: chunked`` over ``Content-Length``),
so a delivery that set its own framing would leave bytes that it reads as a
second request.  A ``build_delivery`` that sets such a header fails its
attempt with the header named, and nothing reaches the receiver; ordinary
deliveries on one kept-alive connection arrive as exactly one request each.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Delivery, Outbox, OutboxKit, OutboxOptions


class RawReceiver:
    """A keep-alive HTTP/1.1 receiver that records each request it frames (its head) and answers 200."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.heads: list[bytes] = []
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(connection,), daemon=True).start()

    def _connection(self, connection: socket.socket) -> None:
        buffer = b""
        with connection:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                self.heads.append(head)
                fields = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
                }
                if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                    # The last chunk is "0\r\n\r\n"; whatever follows it is the next request.
                    while b"0\r\n\r\n" not in buffer:
                        data = connection.recv(65536)
                        if not data:
                            return
                        buffer += data
                    buffer = buffer.split(b"0\r\n\r\n", 1)[1]
                else:
                    length = int(fields.get(b"content-length", b"0"))
                    while len(buffer) < length:
                        data = connection.recv(65536)
                        if not data:
                            return
                        buffer += data
                    buffer = buffer[length:]
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n")

    def close(self) -> None:
        self.server.close()


class SmuggleBase(DeclarativeBase):
    pass


class Smuggler(Outbox, SmuggleBase):
    """Sends ``headers`` as its build code says: a framing header in them is what the kit must refuse."""

    __tablename__ = "smuggler_outbox"
    __outbox__ = OutboxOptions(job_name="smugglers", max_attempts=3, backoff=(60,))
    RECEIVER = "http://127.0.0.1:1"

    header_name: Mapped[str] = mapped_column(String(100), default="X-Note")
    header_value: Mapped[str] = mapped_column(String(200), default="plain")

    def build_delivery(self) -> Delivery:
        smuggled = '0\r\n\r\nPOST /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n'
        return Delivery(
            url=f"{self.RECEIVER}/hook", json={"text": smuggled}, headers={self.header_name: self.header_value}
        )


@pytest.fixture
def raw_receiver() -> Iterator[RawReceiver]:
    receiver = RawReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def smuggle_engine(engine: Engine, raw_receiver: RawReceiver, monkeypatch) -> Engine:
    SmuggleBase.metadata.create_all(engine)
    monkeypatch.setattr(Smuggler, "RECEIVER", raw_receiver.url)
    return engine


@pytest.mark.parametrize(
    ("name", "value"),
    [("Transfer-Encoding", "chunked"), ("Content-Length", "0"), ("Connection", "close"), ("Host", "internal.test")],
)
def test_a_framing_header_from_build_delivery_fails_the_attempt_and_nothing_reaches_the_receiver(
    smuggle_engine, raw_receiver, clock, name, value
):
    with Session(smuggle_engine) as session, session.begin():
        session.add(Smuggler(header_name=name, header_value=value))
    with OutboxKit(smuggle_engine, [Smuggler], clock=clock) as kit:
        result = kit.drain_once(Smuggler)
    assert (result.claimed, result.delivered) == (1, 0)
    assert (raw_receiver.connections, raw_receiver.heads) == (0, [])
    with Session(smuggle_engine) as session:
        row = session.scalars(select(Smuggler)).one()
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.last_error.startswith(f"build_delivery raised InvalidDeliveryError: Delivery.headers may not set {name!r}")


def test_deliveries_on_one_kept_alive_connection_arrive_as_one_request_each(smuggle_engine, raw_receiver, clock):
    with Session(smuggle_engine) as session, session.begin():
        session.add_all([Smuggler(), Smuggler()])
    with OutboxKit(smuggle_engine, [Smuggler], clock=clock) as kit:
        assert kit.drain(Smuggler).delivered == 2
    assert [head.split(b"\r\n")[0] for head in raw_receiver.heads] == [b"POST /hook HTTP/1.1"] * 2
