"""A drain process for the ordered test outbox (``OrderedEvent``): drains until no row is left to deliver.

Run as a script (tests/integration/test_ordered_processes.py starts two)::

    python -m tests.support.ordered_worker postgresql+psycopg://... --concurrency 32

It prints ``ready`` once its drainer is built, waits for ``go`` on stdin, then
runs the drainer's background loop (as the kit does) until every row is
``done`` or ``stuck``, and prints ``finished``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time

from sqlalchemy import create_engine, text

from outboxkit import Drainer, HttpTransport
from tests.support.models import OrderedEvent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database_url")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=180.0)
    arguments = parser.parse_args()
    engine = create_engine(arguments.database_url, pool_size=5)
    # The breaker is off: the test's receiver answers 503 to the same row number of every key at about the same
    # moment, which opens the shared destination's breaker for its 30 s cool-down, twice; that is the breaker's
    # subject (tests/integration/test_destination*.py), not the order's, and it made this test take 60 to 100 s.
    options = dataclasses.replace(OrderedEvent.__outbox__, concurrency=arguments.concurrency, breaker=None)
    with HttpTransport() as transport:
        drainer = Drainer(engine, OrderedEvent, transport=transport, options=options)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        drainer.start(poll_seconds=0.5)
        deadline = time.monotonic() + arguments.seconds
        try:
            while time.monotonic() < deadline:
                with engine.connect() as connection:
                    left = connection.execute(text("SELECT count(*) FROM ordered_event_outbox WHERE status = 'pending'"))
                    if not left.scalar_one():
                        break
                threading.Event().wait(0.2)  # a poll of the table, not a wait for time to pass
        finally:
            drainer.close()
    engine.dispose()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
