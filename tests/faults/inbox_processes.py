"""The two sides of the inbox fault scenario, each a process of its own.

::

    python -m tests.faults.inbox_processes sender --database-url postgresql+psycopg://...
    python -m tests.faults.inbox_processes receiver --database-url postgresql+psycopg://... --port 8123

The **sender** drains ``SignedEvent`` (an outbox signing with Standard Webhooks,
short real-time settings) through the public API, like tests/faults/worker.py.
The **receiver** serves a ``WebhookReceiver`` with uvicorn on 127.0.0.1:<port>;
its handler adds one to the message's counter in ``applied`` in the receiver's
database, and for 1% of messages (chosen by their id) it answers 500 *after* the
commit, as a proxy timing out would, so the sender retries a message already
handled.  Each prints ``{"event": "ready"}`` once it can be killed meaningfully.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, Text, create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit import Delivery, HttpTransport, Outbox, OutboxKit, OutboxKitSettings
from outboxkit.inbox.webhooks import WebhookMessage, WebhookReceiver
from outboxkit.storage.tables import inbox, inbox_sources
from tests.faults.models import FAULT_OPTIONS

SECRET = "whsec_" + base64.b64encode(b"inbox-fault-scenario-secret-0001").decode()
SOURCE = "fault-sender"
# One message in this many is answered 500 after its commit.
FAIL_AFTER_COMMIT_ONE_IN = 100


class SignedBase(DeclarativeBase):
    pass


class SignedEvent(Outbox, SignedBase):
    """The fault outbox's short, real-time settings (a killed sender's rows come back within 2 s), signing.

    It retries for as long as the scenario's faults last, never parking a row as stuck.
    """

    __tablename__ = "signed_event_outbox"
    __outbox__ = dataclasses.replace(
        FAULT_OPTIONS, job_name="signed-events", backoff=(0.05, 0.1, 0.2, 0.5), max_attempts=500,
        sign_webhooks=True, webhook_secrets=[SECRET],
    )

    target_url: Mapped[str] = mapped_column(Text)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json={"row": self.id})


def fails_after_commit(message_id: str) -> bool:
    digest = hashlib.blake2b(message_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % FAIL_AFTER_COMMIT_ONE_IN == 0


def install_receiver_schema(engine: Engine) -> None:
    inbox.metadata.create_all(engine, tables=[inbox, inbox_sources])
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE applied (message_id text PRIMARY KEY, times integer NOT NULL)"))


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def apply(session: Session, message: WebhookMessage) -> None:
    session.execute(
        text(
            "INSERT INTO applied (message_id, times) VALUES (:id, 1) "
            "ON CONFLICT (message_id) DO UPDATE SET times = applied.times + 1"
        ),
        {"id": message.message_id},
    )


def receiver_app(engine: Engine) -> FastAPI:
    receiver = WebhookReceiver(engine, source=SOURCE, secrets=[SECRET], handler=apply)
    app = FastAPI()

    @app.post("/webhooks")
    async def webhooks(request: Request) -> JSONResponse:
        answer = await receiver.endpoint(request)
        message_id = request.headers.get("webhook-id", "")
        if answer.status_code == 200 and json.loads(answer.body) == {"status": "handled"} and fails_after_commit(message_id):
            return JSONResponse({"detail": "answered 500 after the commit"}, status_code=500)
        return answer

    return app


def run_receiver(database_url: str, port: int) -> int:
    engine = create_engine(database_url, pool_size=8, max_overflow=4, pool_pre_ping=True)
    server = uvicorn.Server(uvicorn.Config(receiver_app(engine), host="127.0.0.1", port=port, log_level="warning"))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)  # uvicorn has no started event to wait on
        if server.started:
            emit("ready")

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        engine.dispose()
    return 0


def run_sender(database_url: str) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    engine = create_engine(database_url, pool_size=2, max_overflow=2)
    transport = HttpTransport()
    kit = OutboxKit(engine, [SignedEvent], transport=transport, settings=OutboxKitSettings(scheduler_enabled=False))
    try:
        drainer = kit.drainer(SignedEvent)
        emit("ready")
        parent = os.getppid()
        while not stop.is_set() and os.getppid() == parent:  # an orphan stops
            result = drainer.drain(stop=stop)
            if result.claimed == 0 or not result.ok:
                stop.wait(0.05)
    finally:
        kit.close()
        transport.close()
        engine.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=["sender", "receiver"])
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--port", type=int, help="the receiver's port on 127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if args.side == "receiver":
        return run_receiver(args.database_url, args.port)
    return run_sender(args.database_url)


if __name__ == "__main__":
    sys.exit(main())
