"""The memory a drainer keeps per destination, and what is left once the destinations are idle.

A multi-tenant sender may deliver to tens of thousands of destinations.  Per
destination a drainer keeps the latest state it stored (``outboxkit.destinations.gate``)
and its receiver's latest answer times (``outboxkit.drain.hung_sends``).  This sends one
row to each of ``--destinations`` destinations (one send and one answer each, as the
drain does for a healthy destination; no database or network), then measures with ``tracemalloc`` the memory
still allocated (``kept_kib``: what a drainer without forgetting kept for
ever), then lets the bound pass on test clocks, uses one more destination,
and measures again (``after_bound_kib``).

Run::

    .venv/bin/python bench/destination_memory.py        # about five seconds

The last line is one JSON object with those keys (KiB) and the number of
destinations each structure still holds.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "admin")]

from exampleapp.models import WebhookOutbox  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from outboxkit.destinations.gate import DestinationGate  # noqa: E402
from outboxkit.drain.hung_sends import ANSWERS_FORGOTTEN_AFTER_SECONDS, HungSends  # noqa: E402


class Ticks:
    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


def use(gate: DestinationGate, hung: HungSends, destination: str, row_id: int, *, clock: float) -> None:
    """What one send to ``destination`` leaves behind: sent, answered in 50 ms."""
    hung.started(row_id, owner=gate, destination=destination, now=clock)
    hung.finished(row_id, answered_in=0.05, now=clock)


def allocated() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destinations", type=int, default=10_000)
    options = parser.parse_args()
    engine = create_engine("postgresql+psycopg://root@127.0.0.1:5432/test")  # never connected: nothing here reads the database
    ticks = Ticks()
    tracemalloc.start()
    gate = DestinationGate(engine, WebhookOutbox, options=WebhookOutbox.__outbox__, monotonic=ticks)
    hung = HungSends(after=1.0, limit=4)
    use(gate, hung, "warm-up", 0, clock=ticks.value)  # what the first send allocates once (ORM and logging state)
    base = allocated()
    for index in range(1, options.destinations + 1):
        use(gate, hung, f"tenant-{index}", index, clock=ticks.value)
    kept = allocated() - base
    ticks.value += max(gate.forget_after, ANSWERS_FORGOTTEN_AFTER_SECONDS)
    use(gate, hung, "tenant-late", options.destinations + 1, clock=ticks.value)
    after = allocated() - base
    tracemalloc.stop()
    figures = {
        "destinations": options.destinations,
        "kept_kib": round(kept / 1024, 1),
        "kept_bytes_per_destination": round(kept / options.destinations),
        "after_bound_kib": round(after / 1024, 1),
        "gate_destinations_after_bound": len(gate.remembered()),
        "answered_destinations_after_bound": len(hung.answered()),
    }
    for name, value in figures.items():
        print(f"{name}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
