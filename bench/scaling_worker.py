"""One drainer process of the scaling benchmark (``bench/drain_scaling.py``).

``--mode worker``: builds a kit over the example ``WebhookOutbox``, opens a
pooled connection, prints ``ready`` and waits for ``go`` on stdin; then runs
the kit's ``DrainWorker`` (the drain loop and its NOTIFY listener, as
``outboxkit worker`` does) until ``exit`` arrives on stdin.

``--mode lifespan``: prints ``starting <time.time()>`` and at once does what
``kit.lifespan`` does on start-up (drain loops, then the election), so the
benchmark can time the first delivery of a new application process; it
then waits for ``exit``.
"""

from __future__ import annotations

import argparse
import sys
import time

from exampleapp.models import WebhookOutbox
from sqlalchemy import create_engine, text

from outboxkit import OutboxKit, OutboxKitSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a drainer process for bench/drain_scaling.py")
    parser.add_argument("--database-url", required=True, help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("--mode", choices=["worker", "lifespan"], default="worker")
    arguments = parser.parse_args(argv)

    engine = create_engine(arguments.database_url, pool_size=5, max_overflow=5)
    # Leadership timings at their defaults: the first delivery must not wait for them.
    kit = OutboxKit(engine, [WebhookOutbox], settings=OutboxKitSettings(environment="production"))
    if arguments.mode == "lifespan":
        from outboxkit.integration import _start, _stop

        print(f"starting {time.time():.6f}", flush=True)
        _start(kit)
        sys.stdin.readline()
        _stop(kit, True)
        return 0
    with engine.connect() as connection:  # pay the first connection before the clock starts
        connection.execute(text("SELECT 1"))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    kit.worker.start()
    sys.stdin.readline()  # "exit"
    kit.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
