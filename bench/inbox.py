"""The inbox: what recording a message costs the receiver, and how many messages one receiver handles.

Three measurements, in one run, against the PostgreSQL server of ``DATABASE_URL``
(default ``postgresql://root@127.0.0.1:5432/test``), in a scratch database
created and dropped here:

1. ``inbox_overhead_ms_p50``: the receiver's database work per message with the
   inbox record (``InboxConsumer.consume``: the INSERT ... ON CONFLICT DO
   NOTHING, the handler's write, the commit) minus the same work without it (a
   transaction with the handler's write alone): the difference of the two
   medians over ``--messages`` messages each, measured alternately so both see
   the same load.  ``with_inbox_ms_p50`` and ``without_inbox_ms_p50`` are the two medians.
2. ``receiver_rows_per_s``: one receiver process (uvicorn, a ``WebhookReceiver``:
   signature verification, the inbox record, a business write) answering
   ``--requests`` requests signed by outboxkit's ``SigningTransport``, sent by
   ``--clients`` threads from this process over keep-alive connections.
   ``sender_rows_per_s`` beside it: one outboxkit drainer delivering a signed
   outbox of ``--requests`` rows to that receiver (both sides at once).
3. ``exactly_once_violations``: messages lost or applied twice in the fault
   scenario tests/faults/test_inbox_exactly_once.py (``--fault-run ci`` by
   default, ``long`` for 10,000 messages, ``skip`` for none: then null).

Run::

    .venv/bin/python bench/inbox.py                 # about a minute on 2 cores

The last line is one JSON object with those keys and the load average.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

import httpx  # noqa: E402
import psycopg  # noqa: E402
from sqlalchemy import Engine, Text, create_engine, insert, text  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column  # noqa: E402

from bench.ceilings import scratch_database  # noqa: E402
from outboxkit import CallableTransport, Delivery, Outbox, OutboxKit, OutboxKitSettings, OutboxOptions  # noqa: E402
from outboxkit.inbox import InboxConsumer  # noqa: E402
from outboxkit.storage.tables import kit_metadata  # noqa: E402
from outboxkit.transports.signing import SigningTransport, WebhookSecrets  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"bench-inbox-secret-0123456789ab").decode()
BUSINESS = "CREATE TABLE IF NOT EXISTS bench_applied (message_id text PRIMARY KEY, amount integer NOT NULL)"


class BenchBase(DeclarativeBase):
    pass


class SignedBenchEvent(Outbox, BenchBase):
    __tablename__ = "bench_signed_outbox"
    __outbox__ = OutboxOptions(
        job_name="bench-signed", batch_size=100, concurrency=16, sign_webhooks=True, webhook_secrets=[SECRET], breaker=None
    )

    target_url: Mapped[str] = mapped_column(Text)

    def build_delivery(self) -> Delivery:
        return Delivery(url=self.target_url, json={"row": self.id, "amount": 5})


def business_write(session: Session, message_id: str) -> None:
    session.execute(text("INSERT INTO bench_applied (message_id, amount) VALUES (:id, 5)"), {"id": message_id})


# -- 1. the overhead of the record ------------------------------------------------------------


def overhead(engine: Engine, messages: int) -> dict[str, float]:
    consumer = InboxConsumer(engine, source="bench")
    with_inbox: list[float] = []
    without: list[float] = []

    def recorded(number: int) -> None:
        started = time.perf_counter()
        consumer.consume(f"with-{number}", lambda session: business_write(session, f"with-{number}"))
        with_inbox.append(time.perf_counter() - started)

    def plain(number: int) -> None:
        started = time.perf_counter()
        with Session(engine) as session, session.begin():
            business_write(session, f"without-{number}")
        without.append(time.perf_counter() - started)

    for number in range(messages):
        first, second = (recorded, plain) if number % 2 == 0 else (plain, recorded)
        first(number)
        second(number)
    with_p50, without_p50 = statistics.median(with_inbox) * 1000, statistics.median(without) * 1000
    return {
        "inbox_overhead_ms_p50": round(with_p50 - without_p50, 3),
        "with_inbox_ms_p50": round(with_p50, 3),
        "without_inbox_ms_p50": round(without_p50, 3),
    }


# -- 2. one receiver process ----------------------------------------------------------------------


def serve(database_url: str) -> None:
    """The receiver process: a WebhookReceiver under uvicorn on a free port, announced as ``listening <port>``."""
    import uvicorn
    from fastapi import FastAPI

    from outboxkit.inbox.webhooks import WebhookMessage, WebhookReceiver

    engine = create_engine(database_url, pool_size=16, max_overflow=0)

    def handle(session: Session, message: WebhookMessage) -> None:
        business_write(session, message.message_id)

    app = FastAPI()
    app.include_router(WebhookReceiver(engine, source="bench", secrets=[SECRET], handler=handle).router("/webhooks"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))

    def announce() -> None:
        while not server.started:
            time.sleep(0.01)  # uvicorn has no started event to wait on
        print(f"listening {server.servers[0].sockets[0].getsockname()[1]}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run()


def start_receiver(database_url: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", database_url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening "):
        process.kill()
        raise RuntimeError(f"the receiver did not start: {line!r}")
    return process, f"http://127.0.0.1:{line.split()[1]}/webhooks"


def receiver_rate(url: str, requests: int, clients: int) -> tuple[float, dict[int, int]]:
    signer = SigningTransport(CallableTransport(lambda delivery, key: 200), WebhookSecrets([SECRET]))  # only .sign is used
    signed = [
        signer.sign(Delivery(url=url, json={"row": number, "amount": 5}), idempotency_key=f"direct-{number}")
        for number in range(requests)
    ]
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def client(share: list[Delivery]) -> None:
        with httpx.Client(timeout=30) as session:
            for delivery in share:
                answer = session.post(url, content=delivery.body(), headers=dict(delivery.headers))
                with lock:
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    threads = [threading.Thread(target=client, args=(signed[index::clients],)) for index in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return requests / (time.perf_counter() - started), statuses


def sender_rate(engine: Engine, url: str, rows: int) -> float:
    with engine.begin() as connection:
        connection.execute(insert(SignedBenchEvent), [{"target_url": url}] * rows)
    settings = OutboxKitSettings(scheduler_enabled=False, listen_enabled=False)
    with OutboxKit(engine, [SignedBenchEvent], settings=settings) as kit:
        drainer = kit.drainer(SignedBenchEvent)
        delivered = 0
        started = time.perf_counter()
        while delivered < rows:
            result = drainer.drain_once()
            delivered += result.delivered
            if result.claimed == 0:
                raise RuntimeError(f"the drain stopped at {delivered} of {rows} rows: {result}")
        return rows / (time.perf_counter() - started)


# -- 3. the fault scenario ----------------------------------------------------------------------------


def fault_violations(variant: str) -> dict[str, Any]:
    if variant == "skip":
        return {"exactly_once_violations": None}
    with tempfile.TemporaryDirectory() as report:
        environment = {**os.environ, "OUTBOXKIT_FAULT_REPORT_DIR": report}
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "tests/faults/test_inbox_exactly_once.py", "-k", variant,
             "-m", "slow or not slow", "-p", "no:cacheprovider"],
            cwd=ROOT, env=environment, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        figures = json.loads((Path(report) / f"inbox-exactly-once-{variant}.json").read_text())
    details = figures["details"]
    return {
        "exactly_once_violations": figures["lost"] + details["applied twice"],
        "fault_messages": figures["rows"],
        "fault_duplicates_dropped": details["duplicates delivered and dropped"],
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per side of the overhead measurement")
    parser.add_argument("--requests", type=int, default=3000, help="requests to the receiver (and rows the sender drains)")
    parser.add_argument("--clients", type=int, default=8, help="client threads sending to the receiver")
    parser.add_argument("--fault-run", choices=["ci", "long", "skip"], default="ci")
    options = parser.parse_args()
    scratch = scratch_database()
    with psycopg.connect(scratch.server_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{scratch.name}"')
    engine = create_engine(scratch.sqlalchemy_url, pool_size=4)
    receiver: subprocess.Popen[str] | None = None
    try:
        kit_metadata.create_all(engine)  # the inbox's tables and, for the sender, the rest of the kit's
        BenchBase.metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(text(BUSINESS))
        figures: dict[str, Any] = overhead(engine, options.messages)
        receiver, url = start_receiver(scratch.sqlalchemy_url)
        rate, statuses = receiver_rate(url, options.requests, options.clients)
        if statuses != {200: options.requests}:
            raise RuntimeError(f"the receiver did not answer 200 to every request: {statuses}")
        figures["receiver_rows_per_s"] = round(rate, 1)
        figures["sender_rows_per_s"] = round(sender_rate(engine, url, options.requests), 1)
        with engine.connect() as connection:
            applied = connection.execute(text("SELECT count(*) FROM bench_applied")).scalar_one()
        expected = 2 * options.messages + 2 * options.requests
        if applied != expected:
            raise RuntimeError(f"{applied} business rows, expected {expected}")
    finally:
        if receiver is not None:
            receiver.terminate()
            receiver.wait(30)
        engine.dispose()
        with psycopg.connect(scratch.server_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{scratch.name}" WITH (FORCE)')
    figures.update(fault_violations(options.fault_run))
    figures.update(
        messages=options.messages, requests=options.requests, clients=options.clients, cpus=os.cpu_count(),
        load_average=" ".join(f"{value:.1f}" for value in os.getloadavg()),
    )
    for name, value in figures.items():
        print(f"{name}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
