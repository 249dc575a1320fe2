"""What the URL guard adds to each send of a schedule's request (outboxkit.transports.guarded).

``GuardedTransport`` checks the URL again before every send and pins the
delivery to the checked address.  This measures that work per send, wall
time (the name lookup waits on a thread), no network and no database: the
inner transport is a ``CallableTransport`` that answers 200 at once, and the
same sends through it unguarded are subtracted.  The best of five rounds of
``--sends`` sends:

* a URL whose host is a name (``localhost``, allow-listed), resolved by the
  system resolver from the hosts file on a lookup thread, as every name is:
  ``ssrf_guard_us_per_send``;
* a URL whose host is an IP literal (no lookup): ``ssrf_guard_us_per_send_ip_literal``.

A name served by DNS adds the resolver's own time (its cache, or a round
trip to the DNS server) to the first figure.

Run::

    .venv/bin/python bench/url_guard.py            # a few seconds

The last line is one JSON object with those keys (microseconds per send).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from outboxkit import CallableTransport, Delivery  # noqa: E402
from outboxkit.transports.base import Transport  # noqa: E402
from outboxkit.transports.guarded import GuardedTransport  # noqa: E402
from outboxkit.url_guard import UrlGuard  # noqa: E402

ROUNDS = 5


def seconds_for(transport: Transport, delivery: Delivery, keys: list[str]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for key in keys:
            result = transport.send(delivery, idempotency_key=key, timeout=10.0)
            assert result.status_code == 200, result.error
        best = min(best, time.perf_counter() - started)
    return best


def microseconds_per_send(url: str, sends: int) -> float:
    inner = CallableTransport(lambda sent, key: 200)
    guarded = GuardedTransport(inner, guard=UrlGuard.from_entries(["127.0.0.1/32", "::1/128", "localhost"]))
    delivery = Delivery(url=url, json={"schedule": "partner.ping", "n": 1})
    keys = [str(uuid.uuid4()) for _ in range(sends)]
    return (seconds_for(guarded, delivery, keys) - seconds_for(inner, delivery, keys)) / sends * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sends", type=int, default=2_000)
    options = parser.parse_args()
    figures = {
        "ssrf_guard_us_per_send": round(microseconds_per_send("http://localhost:8080/hook", options.sends), 1),
        "ssrf_guard_us_per_send_ip_literal": round(microseconds_per_send("http://127.0.0.1:8080/hook", options.sends), 1),
        "sends": options.sends,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
