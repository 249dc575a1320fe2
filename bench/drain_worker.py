"""The drainer process of the drain benchmark.

It builds an ``OutboxKit`` over the example ``WebhookOutbox``, opens its
connections, prints ``ready`` and waits for a ``go`` line on stdin, so the
benchmark can snapshot this process's CPU time (and the PostgreSQL backends
serving it) with start-up already paid.  Then it runs ``OutboxKit.drain`` in a
loop until ``--expected`` rows are delivered (or ``--deadline`` seconds pass)
and prints one JSON line: elapsed seconds from the first claim to the last
recorded ``done``, the drain counts and its peak RSS.  It then waits for a
``exit`` line, so its CPU times can be read before it ends.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from sqlalchemy import create_engine, text

from exampleapp.models import WebhookOutbox
from outboxkit import DrainResult, OutboxKit, OutboxKitSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drain the benchmark outbox until every row is delivered")
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--expected", type=int, required=True, help="stop once this many rows are delivered")
    parser.add_argument("--concurrency", type=int, default=None, help="override the outbox's send concurrency")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after this many seconds")
    arguments = parser.parse_args(argv)

    engine = create_engine(arguments.database_url, pool_size=5, max_overflow=5)
    overrides = {"concurrency": arguments.concurrency} if arguments.concurrency else {}
    settings = OutboxKitSettings(outboxes={"webhooks": overrides} if overrides else {})
    kit = OutboxKit(engine, [WebhookOutbox], settings=settings)
    with engine.connect() as connection:  # open the first pooled connection before the clock starts
        connection.execute(text("SELECT 1"))
    kit.drainer(WebhookOutbox)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1

    total = DrainResult(job_name=kit.options(WebhookOutbox).job_name)
    started = time.monotonic()
    while total.delivered < arguments.expected and time.monotonic() - started < arguments.deadline:
        result = kit.drain(WebhookOutbox)
        total.add(result)
        if not result.claimed:  # rows left are in backoff or held by a lease: do not spin on the database
            time.sleep(0.05)
    elapsed = time.monotonic() - started
    report = {
        "elapsed_s": elapsed,
        "counts": total.as_counts(),
        "batches": total.batches,
        "errors": total.errors[:5],
        "error": total.error,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    print(json.dumps(report), flush=True)
    sys.stdin.readline()  # "exit": the benchmark has read our CPU times and our backends' (still connected)
    kit.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
